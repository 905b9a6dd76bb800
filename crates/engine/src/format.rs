//! Numbers as a person reads them, for messages, reports and hints. A leaf: depends on nothing in the crate.
//! (Exact values stay exact where they are stored: the ledger, JSON.)

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
