//! Bills: a period's usage priced by the plan, with allowances.
//!
//! Money is never a float. Each line's amount is computed from the usage's
//! integer counters (packets, bytes, CPU ns, invocations, byte-ms of state)
//! and the plan's exact decimal prices and allowances, and rounded once, to
//! the currency's minor unit, half away from zero ([`Currency::to_minor`]).
//! A bill's total is the sum of its lines' rounded amounts. The one step
//! that is not exact is GB-hours of state (byte-ms / 3.6 × 10^15), a
//! division carried to 28 significant digits before the rounding.

use crate::config::PricePlan;
use crate::money::{Currency, Exact};
use crate::store::UsageSums;
use rust_decimal::Decimal;
use rust_decimal::prelude::ToPrimitive;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One priced item. Quantities are numbers (measurements, for reading);
/// money is never a float: amounts are integer minor units of the
/// currency and decimal strings, unit prices decimal strings exactly as
/// the plan gives them.
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
    /// billable × unit price in the currency's minor units (cents for
    /// USD, yen for JPY), computed exactly and rounded once, half away
    /// from zero.
    pub amount_minor: i64,
    /// The same amount as a decimal string with the currency's minor
    /// digits (`"12.34"`, `"1234"` in JPY).
    #[schema(example = "12.34")]
    pub amount: String,
}

/// Byte-milliseconds of state in GB-hours (10^9 bytes held for an hour),
/// for reading (bills price byte-ms exactly).
pub fn gb_hours(byte_ms: u128) -> f64 {
    byte_ms as f64 / 3.6e15
}

/// Base units (packets, bytes, ns, byte-ms) in one unit of a bill line.
const MILLION: i64 = 1_000_000;
const GB: i64 = 1_000_000_000;
const SECOND_NS: i64 = 1_000_000_000;
const GB_HOUR_BYTE_MS: i64 = 3_600_000_000_000_000;

/// A counter as a decimal; a count beyond what a decimal holds (some
/// 7.9 × 10^28) saturates, far beyond any bill.
fn counter(n: u128) -> Decimal {
    i128::try_from(n).ok().and_then(|n| Decimal::try_from_i128_with_scale(n, 0).ok()).unwrap_or(Decimal::MAX)
}

/// One line: `used` base units, of which `included` units (of `per_unit`
/// base units each) are free, at `price` per unit.
fn line(
    item: &str,
    unit: &str,
    used: u128,
    included: Decimal,
    per_unit: i64,
    price: Exact,
    currency: &Currency,
) -> BillLine {
    let per_unit = Decimal::from(per_unit);
    let used = counter(used);
    let free = included.checked_mul(per_unit).unwrap_or(Decimal::MAX);
    let billable = (used - free.min(used)).max(Decimal::ZERO);
    // Multiply first, divide last: exact but for a division by 3.6e15.
    let amount = billable
        .checked_mul(price.value())
        .map(|a| a.checked_div(per_unit).unwrap_or(Decimal::MAX))
        .unwrap_or(Decimal::MAX);
    let amount_minor = currency.to_minor(amount);
    let units = |d: Decimal| d.checked_div(per_unit).and_then(|d| d.to_f64()).unwrap_or(f64::MAX);
    BillLine {
        item: item.into(),
        unit: unit.into(),
        quantity: units(used),
        included: included.to_f64().unwrap_or(f64::MAX),
        billable: units(billable),
        unit_price: price.to_string(),
        amount_minor,
        amount: currency.format(amount_minor),
    }
}

/// The priced lines for usage totals.
pub fn lines(plan: &PricePlan, total: &UsageSums) -> Vec<BillLine> {
    let inc = &plan.included;
    let c = &plan.currency;
    let count = |n: u64| Decimal::from(n) / Decimal::from(MILLION);
    vec![
        line(
            "packets",
            "million packets",
            u128::from(total.sums.packets),
            count(inc.packets),
            MILLION,
            plan.per_million_packets,
            c,
        ),
        // Bytes the NFs were handed and bytes that passed under their
        // offload entries: both processed.
        line(
            "data",
            "GB",
            u128::from(total.sums.bytes) + u128::from(total.sums.offloaded_bytes),
            inc.gb.value(),
            GB,
            plan.per_gb,
            c,
        ),
        line(
            "cpu",
            "CPU seconds",
            u128::from(total.sums.cpu_ns),
            inc.cpu_seconds.value(),
            SECOND_NS,
            plan.per_cpu_second,
            c,
        ),
        line(
            "invocations",
            "million invocations",
            u128::from(total.sums.invocations),
            count(inc.invocations),
            MILLION,
            plan.per_million_invocations,
            c,
        ),
        line(
            "state",
            "GB-hours",
            total.state_byte_ms,
            inc.state_gb_hours.value(),
            GB_HOUR_BYTE_MS,
            plan.per_gb_hour_state,
            c,
        ),
        line(
            "offloaded",
            "million offloaded packets",
            u128::from(total.sums.offloaded_packets),
            Decimal::ZERO,
            MILLION,
            plan.per_million_offloaded_packets.unwrap_or(plan.per_million_packets),
            c,
        ),
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
    fn offloaded_packets_are_billed_at_the_packet_price_unless_priced_and_their_bytes_as_data() {
        let sums = sluice_control::Meters {
            packets: 1_000_000,
            offloaded_packets: 4_000_000,
            bytes: 400_000_000,
            offloaded_bytes: 1_600_000_000,
            ..Default::default()
        };
        let usage = UsageSums { sums, ..Default::default() };
        let plan = PricePlan::default();
        let l = lines(&plan, &usage);
        let find = |l: &[BillLine], item: &str| l.iter().find(|x| x.item == item).unwrap().clone();
        // The allowance (1 M packets) covers the packets handed to NFs,
        // not the offloaded ones: 4 M at 0.05.
        assert_eq!((find(&l, "packets").amount_minor, find(&l, "offloaded").amount_minor), (0, 20));
        assert_eq!(find(&l, "offloaded").unit_price, "0.05");
        // 2 GB processed, 1 included: 1 GB at 0.02.
        assert_eq!(find(&l, "data").amount_minor, 2);
        let plan = PricePlan { per_million_offloaded_packets: Some(Exact::new(1, 2)), ..PricePlan::default() };
        let l = lines(&plan, &usage);
        assert_eq!((find(&l, "offloaded").amount_minor, find(&l, "offloaded").unit_price.as_str()), (4, "0.01"));
    }

    #[test]
    fn allowances_are_subtracted_before_pricing() {
        let plan = PricePlan::default();
        let sums = sluice_control::Meters {
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
        let plan = PricePlan { per_gb_hour_state: Exact::new(5, 1), ..PricePlan::default() };
        // 2 GB held for 3 hours: 6 GB-hours, 1 included.
        let byte_ms = 2_000_000_000 * 3 * 3_600_000;
        let sums = sluice_control::Meters { state_byte_ms: byte_ms, ..Default::default() };
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
                sums: sluice_control::Meters { state_byte_ms: byte_ms, table_bytes: 10, ..Default::default() },
                state_byte_ms: u128::from(byte_ms),
                ..Default::default()
            }
        };
        let t = sum(&[row("a"), row("b")]);
        assert_eq!(t.sums.state_byte_ms, u64::MAX);
        assert_eq!(t.sums.state_bytes(), 20);
        let plan = PricePlan::default();
        let state = lines(&plan, &t).into_iter().find(|l| l.item == "state").unwrap();
        assert!((state.quantity - 6000.0).abs() < 1e-6, "{state:?}");
        assert!((state.billable - 5999.0).abs() < 1e-6, "{state:?}");
        assert_eq!((state.amount_minor, state.amount.as_str()), (5999, "59.99"));
    }

    #[test]
    fn money_is_exact_decimals_rounded_once() {
        // 0.1 + 0.2: 1 M packets at 0.1 and 2 M at 0.2 would drift in
        // floats; here a price of 0.3 per million on 3 M billable packets
        // is exactly 0.90.
        let plan = PricePlan {
            per_million_packets: Exact::new(3, 1),
            included: crate::config::Included { packets: 0, ..Default::default() },
            ..PricePlan::default()
        };
        let sums = sluice_control::Meters { packets: 3_000_000, ..Default::default() };
        let l = lines(&plan, &UsageSums { sums, ..Default::default() });
        assert_eq!((l[0].amount_minor, l[0].amount.as_str(), l[0].unit_price.as_str()), (90, "0.90", "0.3"));
        // Half a cent rounds away from zero, once: 0.005 per million on
        // 1 M packets is 0.01, on 0.999999 M it is 0.00.
        let plan = PricePlan { per_million_packets: Exact::new(5, 3), ..plan };
        let priced = |packets| {
            let sums = sluice_control::Meters { packets, ..Default::default() };
            lines(&plan, &UsageSums { sums, ..Default::default() })[0].amount_minor
        };
        assert_eq!((priced(1_000_000), priced(999_999)), (1, 0));
    }

    #[test]
    fn bills_are_in_the_currencys_minor_units() {
        let sums = sluice_control::Meters { packets: 101_000_000, ..Default::default() };
        let usage = UsageSums { sums, ..Default::default() };
        let bill = |code: &str| {
            let plan = PricePlan {
                currency: Currency::from_code(code).unwrap(),
                per_million_packets: Exact::parse("1.2345").unwrap(),
                ..PricePlan::default()
            };
            let l = lines(&plan, &usage).swap_remove(0);
            (l.amount_minor, l.amount)
        };
        // 100 billable million packets at 1.2345.
        assert_eq!(bill("USD"), (12345, "123.45".into()));
        assert_eq!(bill("JPY"), (123, "123".into()));
        assert_eq!(bill("BHD"), (123450, "123.450".into()));
    }

    proptest::proptest! {
        /// Each line is its usage times its price, rounded once (checked
        /// against integer arithmetic), and the total is the sum of the
        /// lines, for any usage, prices and allowances.
        #[test]
        fn lines_are_exact_and_add_up_to_the_total(
            packets in 0u64..1 << 40,
            bytes in 0u64..1 << 44,
            cpu_ns in 0u64..1 << 44,
            invocations in 0u64..1 << 36,
            state_byte_ms in 0u64..1 << 62,
            offloaded in 0u64..1 << 40,
            price in 0u32..1_000_000_000,
            price_scale in 0u32..7,
            included in 0u64..1 << 30,
            currency in proptest::sample::select(vec!["USD", "JPY", "BHD", "EUR"]),
        ) {
            let p = Exact::new(price, price_scale);
            let plan = PricePlan {
                currency: Currency::from_code(currency).unwrap(),
                per_million_packets: p,
                per_gb: p,
                per_cpu_second: p,
                per_million_invocations: p,
                per_gb_hour_state: p,
                per_million_offloaded_packets: Some(p),
                included: crate::config::Included {
                    packets: included,
                    gb: Exact::new(0, 0),
                    cpu_seconds: Exact::new(0, 0),
                    invocations: included,
                    state_gb_hours: Exact::new(0, 0),
                },
            };
            let sums = sluice_control::Meters {
                packets,
                bytes,
                cpu_ns,
                invocations,
                offloaded_packets: offloaded,
                ..Default::default()
            };
            let usage = UsageSums { sums, state_byte_ms: u128::from(state_byte_ms), ..Default::default() };
            let l = lines(&plan, &usage);
            let exp = plan.currency.exponent();
            // round(billable × price / per_unit) in minor units, half up
            // (all non-negative), in integers.
            let oracle = |billable: u128, per_unit: u128| -> i64 {
                let num = billable * u128::from(price) * 10u128.pow(exp);
                let den = per_unit * 10u128.pow(price_scale);
                ((2 * num + den) / (2 * den)) as i64
            };
            proptest::prop_assert_eq!(l[0].amount_minor, oracle(u128::from(packets.saturating_sub(included)), 1_000_000));
            proptest::prop_assert_eq!(l[1].amount_minor, oracle(u128::from(bytes), 1_000_000_000));
            proptest::prop_assert_eq!(l[2].amount_minor, oracle(u128::from(cpu_ns), 1_000_000_000));
            proptest::prop_assert_eq!(l[3].amount_minor, oracle(u128::from(invocations.saturating_sub(included)), 1_000_000));
            proptest::prop_assert_eq!(l[4].amount_minor, oracle(u128::from(state_byte_ms), 3_600_000_000_000_000));
            proptest::prop_assert_eq!(l[5].amount_minor, oracle(u128::from(offloaded), 1_000_000));
            let total: i64 = l.iter().map(|l| l.amount_minor).sum();
            proptest::prop_assert_eq!(total_minor(&l), total);
            for line in &l {
                proptest::prop_assert_eq!(&line.amount, &plan.currency.format(line.amount_minor));
            }
        }
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
