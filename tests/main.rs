//! The single integration-test binary (every extra test binary would link DataFusion again).

/// The zCDP filter: debits, refusals that change nothing, the exact edges of a budget.
mod accounting;
/// The `dpfusion` binary end to end: commands, formats, exit codes, the REPL, closed pipes.
mod cli;
/// Private plans on a Ballista cluster in this process (issue 36): the same releases as one machine.
#[cfg(feature = "cluster")]
mod cluster;
/// Computed values, FILTER and computed GROUP BY keys (issue 56): accuracy, neighbours, refusals.
mod computed;
/// The configuration file: the example loads, mistakes are reported with their fix.
mod config;
/// CORR, COVAR and REGR_*: noisy sums over the rows where both values are present, post-processed, with an interval
/// per row from a parametric bootstrap of the noise; a neighbouring audit of the sums; NULLs; refusals.
mod corr;
/// Answers derived from stored releases (issue 39, `SET dp.reuse = 'derive'`): sub-totals and totals, free.
mod derived;
/// Differential fuzzing of the guarantee: generated queries on neighbouring tables.
mod differential;
/// The README and docs/: every relative link and `#anchor` leads somewhere; the README stays short.
mod docs;
/// One test per finding of the 2026-11-23 audit: error oracles, retried noise, schema leaks, crashes.
mod guarantee;
/// The durable ledger: persistence, contention, SIGKILL, request ids, damaged files.
mod ledger;
/// One-way marginal releases: joint sensitivity, consistency, long tables, the CLI.
mod marginals;
/// The exact samplers' distributions against their probability mass functions.
mod noise_dist;
/// The plan that runs is the plan that was paid for (issue 54): canonical fingerprints, request ids apart from
/// reuse keys, grants at every answer, reuse about the same data, the upgraded ledger.
mod paid_plan;
/// Questions about each person (issue 57): subqueries grouped by the unit, semi-joins and anti-joins on it.
mod per_person;
/// Neighbouring-dataset audits of the whole query path: shifts match the claimed sensitivities.
mod privacy_audit;
/// Public tables (issue 37): queried exactly for free, joined with private tables as lookups, other joins refused.
mod public;
/// The Python package (`import dpfusion`, crates/python): built with maturin into a virtual environment under the
/// target directory, its pytest suite run.
mod python;
/// Quantiles and MIN/MAX by the exponential mechanism (issue 37): the corpus, a neighbouring audit, accuracy.
mod quantiles;
/// Free answers from past releases (issue 39, `SET dp.reuse`): the same measurements asked again cost nothing.
mod reuse;
/// GROUP BY keys without a public domain (issue 38): Gaussian thresholding, (ρ, δ) charges, refusals, an audit.
mod selection;
/// `dpfusion serve` over tokio-postgres: protocols, logins, isolation of analysts, budgets under contention.
mod server;
/// `dpfusion serve`'s catalog (issue 35): one type map for `\d` and results, SQLAlchemy's reflection, a SQLSTATE
/// per kind of error.
mod server_catalog;
/// `dpfusion serve` under hostile connections: slots after login, throttle, message sizes, idle and shutdown,
/// grants at each debit, stable decoy salts, per-analyst charge numbers.
mod server_conn;
/// A soak of the server (issue 34): 64 clients of 4 analysts and a hostile client for 60 s
/// (`DPFUSION_SOAK_SECS`), then a new login within 1 s and a ledger that adds up.
mod server_soak;
/// The server's limits on every message (deep chains, sizes, statements per message, catalog queries) and bound
/// parameters as values.
mod server_wire;
/// VAR_POP/VAR_SAMP/STDDEV (issue 37): three noisy sums, post-processed, with an interval per row.
mod spread;
/// Answered queries: full domains, honest intervals (coverage), post-processing, accuracy of every column.
mod sql_accept;
/// Refused queries: their codes, their fixes, nothing spent; SET only narrows.
mod sql_refuse;
/// Helpers shared by the other modules: configurations, sessions, temporary directories, outcomes.
mod support;
/// Accuracy targets (issue 39, `SET dp.target`): solved ρ, met and not 1 % cheaper; refusals that spend nothing.
mod target;
/// Joins of private tables on their privacy unit (issue 37): bounded after the join, other joins refused.
mod unit_join;
/// The numeric test vectors of the research notes (calibration, conversions, compositions).
mod vectors;
/// Workload releases (issue 39): every k-way marginal in one charge, allocation, consistency, an audit.
mod workload;
