//! The session filter: debits, refusals that change nothing, exact edges of the budget.

use dpfusion::DpError;
use dpfusion::accounting::calibrate::{self, Calibration};
use dpfusion::accounting::{Rho, ZcdpFilter};

fn rho(x: f64) -> Rho {
    Rho::new(x).unwrap()
}

fn gauss(r: f64) -> Calibration {
    calibrate::gaussian(1.0, rho(r)).unwrap()
}

#[test]
fn charges_accumulate_and_are_recorded() {
    let mut f = ZcdpFilter::new(rho(1.0));
    let c1 = f.charge("SELECT COUNT(*) FROM t", vec![gauss(0.25)]).unwrap();
    let c2 = f.charge("two measurements", vec![gauss(0.125), gauss(0.125)]).unwrap();
    assert_eq!((c1.id(), c2.id()), (1, 2));
    assert_eq!(c2.measurements().len(), 2);
    // Each mechanism's recorded cost is a hair (≈1e-14 relative) below the ρ asked for: its σ² is inflated.
    assert!(f.spent().get() <= 0.5 && f.spent().get() > 0.5 - 1e-12);
    assert!(f.remaining().get() >= 0.5 && f.remaining().get() < 0.5 + 1e-12);
    assert_eq!(f.charges().len(), 2);
    assert_eq!(f.charges()[0].label(), "SELECT COUNT(*) FROM t");
}

#[test]
fn over_budget_is_refused_with_all_numbers_and_changes_nothing() {
    let mut f = ZcdpFilter::new(rho(0.1));
    f.charge("q1", vec![gauss(0.06)]).unwrap();
    let before = (f.spent(), f.charges().len());
    let err = f.charge("q2", vec![gauss(0.05)]).unwrap_err();
    match &err {
        DpError::OverBudget { total, spent, requested, remaining } => {
            assert_eq!(*total, 0.1);
            assert!((spent - 0.06).abs() < 1e-12);
            assert!(*spent <= 0.06);
            assert!((requested - 0.05).abs() < 1e-12);
            assert!((remaining - 0.04).abs() < 1e-12);
        }
        other => panic!("expected OverBudget, got {other:?}"),
    }
    let msg = err.to_string();
    for needle in ["total 0.1", "spent 0.06", "costs rho=0.05", "remains", "Nothing was spent"] {
        assert!(msg.contains(needle), "message {msg:?} lacks {needle:?}");
    }
    assert_eq!((f.spent(), f.charges().len()), before);
}

#[test]
fn a_charge_exactly_equal_to_the_remainder_is_allowed() {
    // A budget of exactly what two measurements cost: the second one takes it to zero.
    let (a, b) = (gauss(0.3), gauss(0.7));
    let total = Rho::ZERO.add_up(a.rho()).unwrap().add_up(b.rho()).unwrap();
    let mut f = ZcdpFilter::new(total);
    f.charge("a", vec![a]).unwrap();
    assert_eq!(f.remaining(), b.rho(), "what remains is exactly the second cost");
    f.charge("rest", vec![b]).unwrap();
    assert_eq!(f.remaining(), Rho::ZERO);
    // Nothing more fits, not even a tiny cost.
    assert!(matches!(f.charge("more", vec![gauss(1e-12)]), Err(DpError::OverBudget { .. })));
}

#[test]
fn one_ulp_over_the_total_is_refused() {
    let m = gauss(0.5);
    let mut under = ZcdpFilter::new(rho(m.rho().get().next_down()));
    assert!(matches!(under.charge("ulp over", vec![m.clone()]), Err(DpError::OverBudget { .. })));
    assert_eq!(under.spent(), Rho::ZERO);
    let mut exact = ZcdpFilter::new(m.rho());
    exact.charge("exact", vec![m.clone()]).unwrap();
    assert_eq!(exact.spent(), m.rho());
}

#[test]
fn zero_budget_refuses_everything_and_reports_zero_epsilon() {
    let mut f = ZcdpFilter::new(Rho::ZERO);
    assert!(matches!(f.charge("q", vec![gauss(1e-9)]), Err(DpError::OverBudget { .. })));
    let b = f.epsilon(1e-6).unwrap();
    assert_eq!(b.epsilon, 0.0);
}

#[test]
fn invalid_inputs() {
    assert!(Rho::new(-0.1).is_err());
    assert!(Rho::new(f64::NAN).is_err());
    let f = ZcdpFilter::new(rho(1.0));
    assert!(f.epsilon(0.0).is_err());
    assert!(f.epsilon(1.0).is_err());
    assert!(f.epsilon(f64::NAN).is_err());
    let mut f = ZcdpFilter::new(rho(1.0));
    assert!(f.charge("empty", vec![]).is_err());
}

#[test]
fn spent_is_never_undercounted_over_many_inexact_charges() {
    let mut f = ZcdpFilter::new(rho(1.0));
    for _ in 0..10 {
        f.charge("tenth", vec![gauss(0.1)]).unwrap();
    }
    let mut g = ZcdpFilter::new(rho(1.0));
    for _ in 0..20 {
        g.charge("default query", vec![gauss(0.05)]).unwrap();
    }
    // fl(0.1)·10 > 1 by 5.5e-17, yet ten charges of 0.1 fit in 1.0: each mechanism's σ² is inflated so its true
    // (and recorded) cost is strictly below the ρ asked for. The sum is still never under-counted.
    assert!(f.spent().get() <= 1.0);
    let exact: f64 = f.charges().iter().map(|c| c.rho().get()).sum();
    assert!(f.spent().get() >= exact);
}

#[test]
fn a_charge_read_back_from_the_ledger_is_the_one_debited() {
    use dpfusion::accounting::ledger::{Ledger, SqliteLedger};
    let dir = crate::support::TempDir::new("readback");
    let l = SqliteLedger::open(&dir.join("l.db"), "b", rho(1.0), std::time::Duration::from_secs(5)).unwrap();
    let c = l.charge("q", &[], vec![gauss(0.1), calibrate::laplace(2.0, rho(0.2)).unwrap()], &[]).unwrap();
    assert_eq!(l.charges().unwrap(), vec![c.charge().clone()]);
}

#[test]
fn a_huge_budget_still_reports_an_epsilon() {
    use dpfusion::accounting::convert;
    // The zCDP bounds give a finite ε for any ρ.
    let b = convert::epsilon_for_rho(1e15, 1e-6).unwrap();
    assert!(b.epsilon.is_finite() && b.epsilon >= 1e15, "{b:?}");
    let mut f = ZcdpFilter::new(rho(1e15));
    f.charge("huge", vec![gauss(1e8)]).unwrap();
    assert!(f.epsilon(1e-6).unwrap().epsilon.is_finite());
}

/// Key selection's (ρ, δ) by hand (issue 38). With m = 1 and g = 1 at ρ = 0.5, σ² = Δ₂²/(2ρ) = 1 (inflated by
/// 2⁻⁴⁶); the discrete Gaussian's normaliser is Σ_z e^{−z²/2} = 2.5066282880, so
/// P(Z ≥ 5) = (e^{−12.5} + e^{−18} + …)/2.5066 = 1.4928e-6 > 1e-6 and P(Z ≥ 6) = (e^{−18} + e^{−24.5} + …)/2.5066
/// = 6.0850226e-9 ≤ 1e-6: the lowest threshold is τ = 6 + m = 7 and δ = 6.0850226e-9. With g = 4 at ρ = 0.5,
/// Δ₂ = 2 and σ² = 4; p must be ≤ 1 − (1 − 1e-6)^{1/4} = 2.5000009e-7: P(Z ≥ 10) = 8.0038e-7 is not,
/// P(Z ≥ 11) = 5.7024911e-8 is, so τ = 12 and δ = 1 − (1 − 5.7024911e-8)⁴ = 2.2809962e-7. (The tails summed
/// over z ≤ 100 in double precision.)
#[test]
fn key_selection_charges_carry_hand_computed_deltas() {
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b;
    let (c, sel) = calibrate::selection(1, 1, rho(0.5), 1e-6).unwrap();
    assert_eq!(sel.threshold(), 7);
    assert!(close(c.delta(), 6.0850226e-9) && c.delta() >= 6.0850225909e-9, "{}", c.delta());
    assert!(c.rho().get() <= 0.5 && c.rho().get() > 0.5 - 1e-12);
    let (c4, sel4) = calibrate::selection(1, 4, rho(0.5), 1e-6).unwrap();
    assert_eq!(sel4.threshold(), 12);
    assert!(close(c4.delta(), 2.2809962e-7), "{}", c4.delta());
    assert_eq!(c4.sensitivity(), 2.0);
    // A charge's δ is the sum of its selections' (rounded up); a plain measurement adds none.
    let mut f =
        ZcdpFilter::new(rho(2.0)).with_delta(dpfusion::accounting::filter::DeltaBudget { total: 1e-6, spent: 0.0 });
    let charge = f.charge("two selections and a count", vec![c.clone(), c4.clone(), gauss(0.1)]).unwrap();
    assert!(charge.delta() >= c.delta() + c4.delta() && close(charge.delta(), 6.0850226e-9 + 2.2809962e-7));
    assert!(close(f.delta().spent, charge.delta()));
    assert_eq!(ZcdpFilter::new(rho(1.0)).charge("plain", vec![gauss(0.1)]).unwrap().delta(), 0.0);
}

/// A selection whose δ does not fit what remains of the δ budget is refused, with the numbers, and changes nothing
/// (neither ρ nor δ); a session with no δ budget (the default) refuses every selection and says how to allow one.
#[test]
fn a_selection_over_the_delta_budget_is_refused_and_changes_nothing() {
    use dpfusion::accounting::filter::DeltaBudget;
    let (c4, _) = calibrate::selection(1, 4, rho(0.05), 1e-7).unwrap();
    let mut f = ZcdpFilter::new(rho(1.0)).with_delta(DeltaBudget { total: 1.5e-7, spent: 0.0 });
    f.charge("first", vec![c4.clone()]).unwrap();
    let (spent, delta) = (f.spent(), f.delta());
    let e = f.charge("second", vec![c4.clone()]).unwrap_err();
    assert_eq!(e.code(), "over_delta_budget");
    assert!(e.is_refusal() && e.to_string().contains("Nothing was spent"), "{e}");
    assert_eq!((f.spent(), f.delta(), f.charges().len()), (spent, delta, 1));
    let e = ZcdpFilter::new(rho(1.0)).charge("no delta budget", vec![c4]).unwrap_err();
    assert!(matches!(e, DpError::OverDelta { total, .. } if total == 0.0));
    assert!(e.hint().unwrap().contains("delta_budget"), "{e}");
}

/// The (ε, δ) of a history with selections: the ε of the conditioned measurements at δ′, widened by
/// ln(1/(1 − δₛ)), at δ′ + δₛ (convert::with_selection's claim). For one selection with m = 1, g = 1 at ρ = 0.5 the
/// conditioned mechanism is the discrete Gaussian with σ² = 1 and shift 1: its ε at δ′ is what a plain count at
/// the same ρ reports, so the two differ by exactly the widening.
#[test]
fn the_epsilon_of_a_selection_is_the_counts_widened_by_its_delta() {
    use dpfusion::accounting::calibrate::Shape;
    use dpfusion::accounting::convert::epsilon_for_measurements;
    let (c, _) = calibrate::selection(1, 1, rho(0.5), 1e-6).unwrap();
    let count = calibrate::gaussian(1.0, rho(0.5)).unwrap().with_shape(Shape { linf: 1, cells: 1 }).unwrap();
    let with = epsilon_for_measurements(std::slice::from_ref(&c), 1e-6).unwrap();
    let without = epsilon_for_measurements(&[count], 1e-6).unwrap();
    assert_eq!(with.selection_delta, c.delta());
    assert!((with.delta - (1e-6 + c.delta())).abs() <= 1e-15, "{with:?}");
    let widen = -(-c.delta()).ln_1p();
    assert!(with.epsilon >= without.epsilon + widen && with.epsilon <= without.epsilon + widen + 1e-9, "{with:?}");
    assert_eq!(without.selection_delta, 0.0);
}
