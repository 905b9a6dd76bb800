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
    let c = l.charge("q", &[], vec![gauss(0.1), calibrate::laplace(2.0, rho(0.2)).unwrap()]).unwrap();
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
