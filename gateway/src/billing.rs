//! Bills: a period's usage priced by the plan, with allowances.

use crate::config::PricePlan;
use crate::store::UsageSums;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One priced item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BillLine {
    /// `packets`, `data`, `cpu`, `invocations`, `state`.
    pub item: String,
    /// Unit of `quantity`, `included`, `billable`.
    pub unit: String,
    /// Used in the period.
    pub quantity: f64,
    /// Free allowance.
    pub included: f64,
    /// Charged quantity: max(0, quantity - included).
    pub billable: f64,
    /// Price per unit.
    pub unit_price: f64,
    /// billable × unit price, rounded to cents.
    pub amount: f64,
}

/// Rounds to cents.
fn cents(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Byte-milliseconds of state in GB-hours (10^9 bytes held for an hour).
pub fn gb_hours(byte_ms: u128) -> f64 {
    byte_ms as f64 / 3.6e15
}

/// The priced lines for usage totals.
pub fn lines(plan: &PricePlan, total: &UsageSums) -> Vec<BillLine> {
    let inc = &plan.included;
    let line = |item: &str, unit: &str, quantity: f64, included: f64, unit_price: f64| {
        let billable = (quantity - included).max(0.0);
        BillLine {
            item: item.into(),
            unit: unit.into(),
            quantity,
            included,
            billable,
            unit_price,
            amount: cents(billable * unit_price),
        }
    };
    vec![
        line(
            "packets",
            "million packets",
            total.sums.packets as f64 / 1e6,
            inc.packets as f64 / 1e6,
            plan.per_million_packets,
        ),
        line("data", "GB", total.sums.bytes as f64 / 1e9, inc.gb, plan.per_gb),
        line("cpu", "CPU seconds", total.sums.cpu_ns as f64 / 1e9, inc.cpu_seconds, plan.per_cpu_second),
        line(
            "invocations",
            "million invocations",
            total.sums.invocations as f64 / 1e6,
            inc.invocations as f64 / 1e6,
            plan.per_million_invocations,
        ),
        line("state", "GB-hours", gb_hours(total.state_byte_ms), inc.state_gb_hours, plan.per_gb_hour_state),
    ]
}

/// Sum of line amounts.
pub fn total(lines: &[BillLine]) -> f64 {
    cents(lines.iter().map(|l| l.amount).sum())
}

/// Sums usage rows.
pub fn sum(rows: &[UsageSums]) -> UsageSums {
    let mut t = UsageSums::default();
    for r in rows {
        t.add(r);
    }
    t
}

/// `[from, to)` in ms of a `YYYY-MM` period (UTC).
pub fn period_range(period: &str) -> Result<(i64, i64), String> {
    let bad = || format!("period '{period}' is not a month written YYYY-MM (e.g. 2026-11)");
    let (y, m) = period.split_once('-').ok_or_else(bad)?;
    if y.len() != 4 || m.len() != 2 {
        return Err(bad());
    }
    let year: i32 = y.parse().map_err(|_| bad())?;
    let month: u8 = m.parse().map_err(|_| bad())?;
    let month = time::Month::try_from(month).map_err(|_| bad())?;
    let start = time::Date::from_calendar_date(year, month, 1).map_err(|_| bad())?;
    let (ny, nm) = if month == time::Month::December { (year + 1, time::Month::January) } else { (year, month.next()) };
    let end = time::Date::from_calendar_date(ny, nm, 1).map_err(|_| bad())?;
    let ms = |d: time::Date| (d.midnight().assume_utc().unix_timestamp_nanos() / 1_000_000) as i64;
    Ok((ms(start), ms(end)))
}

/// CSV field quoting (RFC 4180).
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    #[test]
    fn allowances_are_subtracted_before_pricing() {
        let plan = PricePlan::default();
        let sums = sluice_control::MeterSums {
            packets: 3_000_000,
            bytes: 500_000_000,
            cpu_ns: 12_000_000_000,
            invocations: 100_000,
            ..Default::default()
        };
        let t = UsageSums { sums, ..Default::default() };
        let l = lines(&plan, &t);
        assert_eq!(l[0].billable, 2.0);
        assert_eq!(l[0].amount, 0.10);
        assert_eq!(l[1].billable, 0.0);
        assert_eq!(l[1].amount, 0.0);
        assert!((l[2].billable - 2.0).abs() < 1e-9);
        assert_eq!(l[2].amount, 0.2);
        assert_eq!(l[3].amount, 0.0);
        assert_eq!(l[4].item, "state");
        assert_eq!(l[4].amount, 0.0);
        assert_eq!(total(&l), 0.3);
    }

    #[test]
    fn state_is_priced_per_gb_hour_after_its_allowance() {
        let plan = PricePlan { per_gb_hour_state: 0.5, ..PricePlan::default() };
        // 2 GB held for 3 hours: 6 GB-hours, 1 included.
        let byte_ms = 2_000_000_000 * 3 * 3_600_000;
        let sums = sluice_control::MeterSums { state_byte_ms: byte_ms, ..Default::default() };
        let l = lines(&plan, &UsageSums { sums, state_byte_ms: u128::from(byte_ms), ..Default::default() });
        let state = l.iter().find(|l| l.item == "state").unwrap();
        assert_eq!(state.unit, "GB-hours");
        assert!((state.quantity - 6.0).abs() < 1e-9);
        assert!((state.billable - 5.0).abs() < 1e-9);
        assert_eq!(state.amount, 2.5);
    }

    #[test]
    fn state_rows_past_u64_byte_ms_are_billed_in_full() {
        // Two NFs that each held 3000 GB-hours: together more byte-ms than
        // a u64 holds.
        let row = |nf: &str| {
            let byte_ms: u64 = 3000 * 3_600_000_000_000_000;
            UsageSums {
                nf: nf.into(),
                sums: sluice_control::MeterSums { state_byte_ms: byte_ms, ..Default::default() },
                state_byte_ms: u128::from(byte_ms),
                state_bytes: 10,
                ..Default::default()
            }
        };
        let t = sum(&[row("a"), row("b")]);
        assert_eq!(t.sums.state_byte_ms, u64::MAX);
        assert_eq!(t.state_bytes, 20);
        let plan = PricePlan::default();
        let state = lines(&plan, &t).into_iter().find(|l| l.item == "state").unwrap();
        assert!((state.quantity - 6000.0).abs() < 1e-6, "{state:?}");
        assert!((state.billable - 5999.0).abs() < 1e-6, "{state:?}");
        assert_eq!(state.amount, 59.99);
    }

    #[test]
    fn periods_are_calendar_months() {
        assert_eq!(period_range("2026-11").unwrap(), (1_793_491_200_000, 1_796_083_200_000));
        let (_, dec_end) = period_range("2026-12").unwrap();
        assert_eq!(dec_end, period_range("2027-01").unwrap().0);
        for bad in ["2026", "2026-13", "26-11", "2026-1", "x-yz"] {
            assert!(period_range(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn csv_quotes_what_needs_it() {
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("plain"), "plain");
    }
}
