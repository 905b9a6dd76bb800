//! The numeric test vectors of the research notes (seeds.md §3, computed there with mpmath at 50 digits), checked
//! to 1e-9 relative: Gaussian calibration (T1), pure-DP → zCDP (T2), zCDP → (ε, δ) by every conversion (T3,
//! T3b), inverse conversions (T4), the exact Gaussian-DP curve (T5), pure-Gaussian compositions (T7) and a mixed
//! session (T10).

use dpfusion::accounting::calibrate;
use dpfusion::accounting::convert::{self, BoundKind};
use dpfusion::accounting::{Rho, ZcdpFilter};
use dpfusion::noise::NoiseParams;

const TOL: f64 = 1e-9;

#[track_caller]
fn close(got: f64, want: f64, what: &str) {
    let rel = ((got - want) / want).abs();
    assert!(rel <= TOL || (want == 0.0 && got.abs() <= TOL), "{what}: got {got}, want {want} (rel {rel:e})");
}

fn rho(x: f64) -> Rho {
    Rho::new(x).unwrap()
}

#[test]
fn t1_gaussian_calibration() {
    // (Δ₂, ρ, σ): σ = Δ₂/√(2ρ), BS16 Prop 1.6.
    let cases = [
        (1.0, 0.5, 1.0),
        (1.0, 0.1, 2.23606797749979),
        (1.0, 0.01, 7.07106781186548),
        (1.0, 0.001, 22.3606797749979),
        (std::f64::consts::SQRT_2, 0.5, std::f64::consts::SQRT_2), // T1.5: 1.4142135623731
        (5.0, 0.25, 7.07106781186548),
        (100.0, 0.02, 500.0),
    ];
    for (l2, r, sigma) in cases {
        let c = calibrate::gaussian(l2, rho(r)).unwrap();
        let NoiseParams::Gaussian { sigma_sq } = c.params() else { panic!("not gaussian") };
        // σ² is rounded *up* onto a grid of ~40 bits: equal to 1e-9, never below.
        close(sigma_sq.to_f64().sqrt(), sigma, &format!("T1 sigma (Δ₂={l2}, ρ={r})"));
        assert!(sigma_sq.to_f64() >= l2 * l2 / (2.0 * r));
        close(c.rho().get(), r, "T1 rho charged");
    }
    // T1.8, T1.9: ρ = Δ²/(2σ²).
    close(calibrate::gaussian_for_sigma(1.0, 10.0).unwrap().rho().get(), 0.005, "T1.8");
    close(calibrate::gaussian_for_sigma(100.0, 500.0).unwrap().rho().get(), 0.02, "T1.9");
    // T1.10: μ = Δ/σ; and μ-GDP ⇒ μ²/2-zCDP (T9b.3).
    let c = calibrate::gaussian_for_sigma(1.0, 2.0).unwrap();
    close((2.0 * c.rho().get()).sqrt(), 0.5, "T1.10 mu");
}

#[test]
fn t2_laplace_pure_to_zcdp() {
    // ε-DP ⇒ ε²/2-zCDP (BS16 Prop 1.4): Laplace calibrated at ρ = ε²/2 has pure ε = Δ₁/b.
    for (eps, want_rho) in [(0.1, 0.005), (0.5, 0.125), (1.0, 0.5), (1.09861228866811, 0.603474480406291), (2.0, 2.0)] {
        let c = calibrate::laplace(1.0, rho(want_rho)).unwrap();
        close(c.pure_epsilon().unwrap(), eps, "T2 pure epsilon");
        close(c.rho().get(), want_rho, "T2 rho");
        let NoiseParams::Laplace { scale } = c.params() else { panic!() };
        close(scale.to_f64(), 1.0 / eps, "T2 scale");
    }
}

/// T3: (ρ, δ, simple, sqrt-pi form, BS16 best, CKS20, Gaussian-only exact).
const T3: [(f64, f64, f64, f64, f64, f64, f64); 21] = [
    (0.001, 1e-5, 0.215596602628935, 0.186810793748952, 0.168696405389028, 0.157335393161216, 0.141685367077905),
    (0.001, 1e-6, 0.23607880004768, 0.210131517102496, 0.192926278011603, 0.182895377190076, 0.167943594065665),
    (0.001, 1e-9, 0.288911554731285, 0.268146050993684, 0.2528759507114, 0.245119253871951, 0.23171250147854),
    (0.01, 1e-5, 0.688614042441511, 0.635546331294522, 0.579045792905925, 0.545725548274002, 0.4969753639147),
    (0.01, 1e-6, 0.753384437769968, 0.705278085600141, 0.651523072941347, 0.621692654559602, 0.575055185779997),
    (0.01, 1e-9, 0.920456277631088, 0.881620231221765, 0.833740956003177, 0.810174467867534, 0.768211712795861),
    (0.05, 1e-5, 1.56742712938515, 1.50515801692585, 1.37845145232108, 1.30811834290644, 1.19936957375317),
    (0.05, 1e-6, 1.71225813626911, 1.65561573012424, 1.53511568563079, 1.47159475053242, 1.36757147508431),
    (0.05, 1e-9, 2.08584212732453, 2.03986254013156, 1.93257626844668, 1.88166029106184, 1.78802482694098),
    (0.1, 1e-5, 2.24596602628935, 2.19131517102496, 2.01091042036087, 1.9142388320036, 1.76005714951388),
    (0.1, 1e-6, 2.4507880004768, 2.40100699298302, 2.22957374737784, 2.14193892838547, 1.99452690069634),
    (0.1, 1e-9, 2.97911554731285, 2.93861503084685, 2.7861829554372, 2.7154818867305, 2.58287283478419),
    (0.5, 1e-5, 5.29852591218808, 5.34535175557254, 4.92731020739898, 4.72838698494331, 4.37717809568122),
    (0.5, 1e-6, 5.75652176975693, 5.79930220134859, 5.403504621886, 5.22153444453017, 4.88655411746221),
    (0.5, 1e-9, 6.93789807886804, 6.97287527913077, 6.62332822166731, 6.47407002072649, 6.17393504667091),
    (1.0, 1e-5, 7.78614042441511, 7.95278085600141, 7.34556332809964, 7.07719669580634, 6.57297006703033),
    (1.0, 1e-6, 8.43384437769968, 8.58627062551527, 8.0127592691375, 7.76621662531172, 7.28608096641861),
    (1.0, 1e-9, 10.1045627763109, 10.2294378550096, 9.72534566173144, 9.52146367179223, 9.09255836858179),
    (5.0, 1e-5, 20.1742712938515, 21.0561573012424, 19.5628880342937, 19.0472595523252, 17.8565868301076),
    (5.0, 1e-6, 21.6225813626911, 22.4313478865554, 21.0309354784154, 20.5519488140413, 19.4236564740311),
    (5.0, 1e-9, 25.3584212732453, 26.0239623934634, 24.8110494838945, 24.4059875575594, 23.4075425359455),
];

#[test]
fn t3_zcdp_to_eps_delta_every_conversion() {
    for (r, d, simple, sqrt_pi, best, cks, gauss) in T3 {
        let tag = format!("T3 ρ={r} δ={d}");
        close(convert::eps_simple(r, d).unwrap(), simple, &format!("{tag} simple"));
        close(convert::eps_bs16_sqrt_pi(r, d).unwrap(), sqrt_pi, &format!("{tag} sqrt-pi"));
        close(convert::eps_bs16_tight(r, d).unwrap(), best, &format!("{tag} BS16 best"));
        close(convert::eps_cks20(r, d).unwrap(), cks, &format!("{tag} CKS20"));
        close(convert::gdp_eps((2.0 * r).sqrt(), d).unwrap(), gauss, &format!("{tag} GDP exact"));
        // The reported bound is the smallest valid one: CKS20 without knowledge of the mechanism,
        // the exact GDP curve for an all-Gaussian session.
        let any = convert::epsilon_for_rho(r, d, false).unwrap();
        assert_eq!(any.kind, BoundKind::Cks20, "{tag}");
        close(any.epsilon, cks, &format!("{tag} min"));
        let g = convert::epsilon_for_rho(r, d, true).unwrap();
        assert_eq!(g.kind, BoundKind::GaussianExact, "{tag}");
        close(g.epsilon, gauss, &format!("{tag} min gaussian"));
    }
}

#[test]
fn t3b_delta_at_fixed_epsilon() {
    // (ρ, ε, BS16 term 3, Gaussian-only exact δ).
    for (r, e, best, gauss) in [
        (0.5, 3.0, 0.0119611300293334, 0.00153718536940095),
        (0.1, 1.0, 0.0218966143957259, 0.00318505537833348),
        (1.0, 5.0, 0.00590332945495336, 0.000699607267670607),
    ] {
        close(convert::delta_bs16_tight(r, e).unwrap(), best, "T3b BS16 term 3");
        close(convert::gdp_delta((2.0 * r).sqrt(), e).unwrap(), gauss, "T3b GDP");
    }
    assert!(convert::delta_bs16_tight(0.5, 0.1).is_err(), "ε < ρ is outside Lemma 3.6");
}

#[test]
fn t4_inverse_simple() {
    for (e, d, want) in [
        (1.0, 1e-5, 0.0208199383395355),
        (1.0, 1e-6, 0.0174689047691234),
        (0.5, 1e-6, 0.00444384415909706),
        (3.0, 1e-9, 0.101360822509716),
    ] {
        let r = convert::rho_for_target_simple(e, d).unwrap();
        close(r, want, "T4 rho for target");
        // Round trip: that ρ gives at most the target ε.
        assert!(convert::eps_simple(r, d).unwrap() <= e * (1.0 + 1e-11));
    }
}

#[test]
fn t5_gdp_curve_and_inverse() {
    let deltas = [
        (0.5, 0.0, 0.197412651365847),
        (0.5, 0.5, 0.0524403232876697),
        (0.5, 1.0, 0.00682959498311458),
        (0.5, 2.0, 9.43916863494723e-6),
        (1.0, 0.0, 0.382924922548026),
        (1.0, 0.5, 0.238421708134877),
        (1.0, 1.0, 0.126936737506644),
        (1.0, 2.0, 0.0209236358211137),
        (2.0, 0.0, 0.682689492137086),
        (2.0, 0.5, 0.599185618533933),
        (2.0, 1.0, 0.50986166005467),
        (2.0, 2.0, 0.331897998776829),
        (3.0, 0.0, 0.866385597462284),
        (3.0, 0.5, 0.82999580994769),
        (3.0, 1.0, 0.787600741360385),
        (3.0, 2.0, 0.685874165716049),
    ];
    for (mu, e, want) in deltas {
        close(convert::gdp_delta(mu, e).unwrap(), want, &format!("T5 δ(μ={mu}, ε={e})"));
    }
    let eps = [
        (0.5, 1e-5, 1.99309140441512),
        (0.5, 1e-6, 2.25408465021974),
        (0.5, 1e-9, 2.90973238076362),
        (1.0, 1e-5, 4.37717809568122),
        (1.0, 1e-6, 4.88655411746221),
        (1.0, 1e-9, 6.17393504667091),
        (2.0, 1e-5, 9.9972561464343),
        (2.0, 1e-6, 10.9971512142207),
        (2.0, 1e-9, 13.5347722191655),
    ];
    for (mu, d, want) in eps {
        close(convert::gdp_eps(mu, d).unwrap(), want, &format!("T5 ε(μ={mu}, δ={d})"));
    }
}

/// A session of `k` Gaussian counts at σ, through the real filter.
fn gaussian_session(k: usize, sigma: f64) -> ZcdpFilter {
    let mut f = ZcdpFilter::new(rho(10.0));
    for i in 0..k {
        let c = calibrate::gaussian_for_sigma(1.0, sigma).unwrap();
        f.charge(format!("count {i}"), vec![c]).unwrap();
    }
    f
}

#[test]
fn t7_pure_gaussian_compositions() {
    // (k, σ, ρ_total, [(δ, simple, BS16 best, GDP exact)]).
    let cases = [
        (
            10,
            10.0,
            0.05,
            [
                (1e-5, 1.56742712938515, 1.37845145232108, 1.19936957375317),
                (1e-9, 2.08584212732453, 1.93257626844668, 1.78802482694098),
            ],
        ),
        (
            100,
            10.0,
            0.5,
            [
                (1e-5, 5.29852591218808, 4.92731020739898, 4.37717809568122),
                (1e-6, 5.75652176975693, 5.403504621886, 4.88655411746221),
            ],
        ),
        (
            1000,
            30.0,
            0.555555555555556,
            [
                (1e-5, 5.61364598683938, 5.23222577581202, 4.65298453096851),
                (1e-9, 7.34169597997067, 7.01773405381643, 6.54435761139796),
            ],
        ),
    ];
    for (k, sigma, want_rho, rows) in cases {
        let f = gaussian_session(k, sigma);
        close(f.spent().get(), want_rho, "T7 rho total");
        for (d, simple, best, gauss) in rows {
            let r = f.spent().get();
            close(convert::eps_simple(r, d).unwrap(), simple, "T7 simple");
            close(convert::eps_bs16_tight(r, d).unwrap(), best, "T7 BS16 best");
            let b = f.epsilon(d).unwrap();
            assert_eq!(b.kind, BoundKind::GaussianExact);
            close(b.epsilon, gauss, "T7 GDP exact");
        }
    }
}

#[test]
fn t10_mixed_session() {
    // COUNT σ=10; SUM[0,100] σ=500; Laplace ε=0.1; 20 marginal counts with one σ=20 (Δ₂ = √20).
    let mut f = ZcdpFilter::new(rho(1.0));
    f.charge("count", vec![calibrate::gaussian_for_sigma(1.0, 10.0).unwrap()]).unwrap();
    f.charge("sum", vec![calibrate::gaussian_for_sigma(100.0, 500.0).unwrap()]).unwrap();
    f.charge("laplace", vec![calibrate::laplace(1.0, rho(0.1f64 * 0.1 / 2.0)).unwrap()]).unwrap();
    f.charge("marginals", vec![calibrate::gaussian_for_sigma(20f64.sqrt(), 20.0).unwrap()]).unwrap();
    close(f.spent().get(), 0.055, "T10.12 rho total");
    close(convert::eps_simple(f.spent().get(), 1e-6).unwrap(), 1.79839104126187, "T10.13");
    close(convert::eps_bs16_tight(f.spent().get(), 1e-6).unwrap(), 1.6156357282242, "T10.14");
    // Mixed session: the GDP curve must not be used; CKS20 is then the tightest.
    let b = f.epsilon(1e-6).unwrap();
    assert_eq!(b.kind, BoundKind::Cks20);
    assert!(b.epsilon <= 1.6156357282242);
}

#[test]
fn t9_pure_laplace_session_uses_pure_composition() {
    // 10× Laplace ε = 1: pure composition gives ε = 10 at δ = 0, better than ρ = 5 → 21.62 at 1e-6 (T9.28/29).
    let mut f = ZcdpFilter::new(rho(10.0));
    for _ in 0..10 {
        f.charge("lap", vec![calibrate::laplace(1.0, rho(0.5)).unwrap()]).unwrap();
    }
    close(f.spent().get(), 5.0, "T9 rho");
    close(convert::eps_simple(5.0, 1e-6).unwrap(), 21.6225813626911, "T9.29");
    let b = f.epsilon(1e-6).unwrap();
    assert_eq!(b.kind, BoundKind::PureComposition);
    close(b.epsilon, 10.0, "T9.28");
}
