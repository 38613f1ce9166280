//! Bills: a period's usage priced by the plan, with allowances.

use crate::config::PricePlan;
use crate::store::UsageSums;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One priced item. Quantities are numbers (measurements); money is
/// never a float: amounts are integer minor units (cents, hundredths of
/// the plan's currency) and decimal strings, unit prices decimal strings
/// exactly as the plan gives them.
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
    /// Price per unit, a decimal string in the currency (`"0.05"`).
    #[schema(example = "0.05")]
    pub unit_price: String,
    /// billable × unit price in minor units (cents), rounded half away
    /// from zero.
    pub amount_minor: i64,
    /// The same amount as a decimal string (`"12.34"`).
    #[schema(example = "12.34")]
    pub amount: String,
}

/// Minor units (cents) as a decimal string: `1234` is `"12.34"`.
pub fn decimal(minor: i64) -> String {
    let sign = if minor < 0 { "-" } else { "" };
    let m = minor.unsigned_abs();
    format!("{sign}{}.{:02}", m / 100, m % 100)
}

/// A price as a decimal string: the shortest decimal that reads back as
/// the configured value, never in exponent form (`0.0000001`).
pub fn price(x: f64) -> String {
    let s = format!("{x}");
    if s.contains('.') { s } else { format!("{s}.0") }
}

/// `x` (in the currency) in minor units, rounded half away from zero;
/// saturating far beyond any bill.
fn to_minor(x: f64) -> i64 {
    // `as` saturates for out-of-range floats and maps NaN to 0.
    (x * 100.0).round() as i64
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
        let amount_minor = to_minor(billable * unit_price);
        BillLine {
            item: item.into(),
            unit: unit.into(),
            quantity,
            included,
            billable,
            unit_price: price(unit_price),
            amount_minor,
            amount: decimal(amount_minor),
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

/// Sum of line amounts, minor units: exact, the sum of what each line
/// shows.
pub fn total_minor(lines: &[BillLine]) -> i64 {
    lines.iter().fold(0i64, |t, l| t.saturating_add(l.amount_minor))
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
        assert_eq!((l[0].amount_minor, l[0].amount.as_str()), (10, "0.10"));
        assert_eq!(l[1].billable, 0.0);
        assert_eq!((l[1].amount_minor, l[1].amount.as_str()), (0, "0.00"));
        assert!((l[2].billable - 2.0).abs() < 1e-9);
        assert_eq!((l[2].amount_minor, l[2].amount.as_str()), (20, "0.20"));
        assert_eq!(l[3].amount_minor, 0);
        assert_eq!(l[4].item, "state");
        assert_eq!(l[4].amount_minor, 0);
        assert_eq!(total_minor(&l), 30);
        assert_eq!(l[0].unit_price, "0.05");
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
        assert_eq!((state.amount_minor, state.amount.as_str()), (250, "2.50"));
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
        assert_eq!((state.amount_minor, state.amount.as_str()), (5999, "59.99"));
    }

    #[test]
    fn money_is_exact_text() {
        assert_eq!(decimal(0), "0.00");
        assert_eq!(decimal(5), "0.05");
        assert_eq!(decimal(123_456), "1234.56");
        assert_eq!(decimal(-7), "-0.07");
        assert_eq!(decimal(i64::MIN), "-92233720368547758.08");
        assert_eq!(price(0.05), "0.05");
        assert_eq!(price(1e-7), "0.0000001");
        assert_eq!(price(2.0), "2.0");
        assert_eq!(to_minor(f64::NAN), 0);
        assert_eq!(to_minor(1e300), i64::MAX);
        // 0.1 + 0.2 is no problem when each line is whole cents.
        let l = |m| BillLine {
            item: String::new(),
            unit: String::new(),
            quantity: 0.0,
            included: 0.0,
            billable: 0.0,
            unit_price: String::new(),
            amount_minor: m,
            amount: decimal(m),
        };
        assert_eq!(decimal(total_minor(&[l(10), l(20)])), "0.30");
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
