//! The bundled demonstration: differentially private queries over the US Census PUMS sample
//! (`config/pums.toml`, data in `examples/data/`).
//!
//! Run: `cargo run --example demo` (optionally with a config path and SQL statements as arguments).

use dpfusion::{DpSession, Response};

const TOUR: &[&str] = &[
    "SELECT COUNT(*) AS people FROM pums",
    "SELECT sex, COUNT(*) AS n, AVG(income) AS avg_income FROM pums GROUP BY sex ORDER BY sex",
    "SELECT race, SUM(income) / 1000 AS income_k FROM pums WHERE age >= 18 GROUP BY race ORDER BY race",
    "EXPLAIN DP SELECT married, COUNT(*) FROM pums WHERE age BETWEEN 30 AND 50 GROUP BY married",
    "SET dp.mechanism = 'laplace'",
    "SELECT COUNT(*) AS adults FROM pums WHERE age >= 18",
    "SELECT * FROM pums",
    "SELECT pid, COUNT(*) FROM pums GROUP BY pid",
];

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let config = args.next().unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/config/pums.toml").to_string());
    let statements: Vec<String> = args.collect();
    let statements: Vec<String> =
        if statements.is_empty() { TOUR.iter().map(|s| s.to_string()).collect() } else { statements };
    let session = match DpSession::open(&config).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    if let Ok(b) = session.budget() {
        println!("dpfusion demo over {config}: budget ρ = {} (zCDP), δ = {:e}\n", b.status.rho_total, session.delta());
    }
    let mut failed = false;
    for sql in &statements {
        println!("> {sql}");
        match session.sql(sql).await {
            Ok(Response::Release(r)) => println!("{}\n", r.to_pretty_string()),
            Ok(Response::Public(p)) => println!("{}\n", p.to_pretty_string()),
            Ok(Response::Explain(e)) => println!("{e}\n"),
            Ok(Response::Set { option, value }) => println!("{option} = {value}\n"),
            Err(e) => {
                failed = true;
                println!("refused: {e}\n");
            }
        }
    }
    if let Ok(b) = session.budget() {
        println!(
            "budget: spent ρ = {} of {}, remaining {}; ε = {:.3} at δ = {:e} ({})",
            dpfusion::format::fmt_num(b.status.rho_spent),
            b.status.rho_total,
            dpfusion::format::fmt_num(b.status.rho_remaining),
            b.epsilon.epsilon,
            b.epsilon.delta,
            b.epsilon.kind.describe()
        );
    }
    // The tour deliberately includes refused queries; a user-given list fails if any statement fails.
    if failed && std::env::args().len() > 2 {
        std::process::exit(1);
    }
}
