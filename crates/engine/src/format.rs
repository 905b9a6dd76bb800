//! Numbers as a person reads them, for messages, reports and hints. A leaf: depends on nothing in the crate.
//! (Exact values stay exact where they are stored: the ledger, JSON.)

/// A probability for reading: `< 1e-6`, `> 0.999999`, two significant digits below 0.01, else four decimals.
pub fn fmt_probability(p: f64) -> String {
    if p < 1e-6 {
        "< 1e-6".into()
    } else if p > 0.999_999 {
        "> 0.999999".into()
    } else if p < 0.01 {
        format!("{p:.1e}")
    } else {
        format!("{p:.4}")
    }
}

/// Formats a number compactly (up to 6 significant digits).
pub fn fmt_num(x: f64) -> String {
    if x == 0.0 || (1e-4..1e9).contains(&x.abs()) {
        let s = format!("{x:.6}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        s.to_string()
    } else {
        format!("{x:.4e}")
    }
}
