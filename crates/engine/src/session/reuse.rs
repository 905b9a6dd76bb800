//! Free answers from past releases (`SET dp.reuse`): a query whose measurements were released before, under the
//! same budget, is answered from the stored noisy measurements, at no cost.
//!
//! **What counts as the same.** Two statements have the same measurements when the canonical fingerprints
//! ([`crate::plan::fingerprint`]) of what they measure are equal: the optimized private plan that would run (the
//! bounded plan, with the policy's bounds, domains and limits written into it, and the values of its parameters),
//! the bounded plan's cells, measurements and outputs ([`crate::plan::DpPlan::fingerprint`]) and the noise of
//! every measurement (mechanism and parameter, hence ρ, and a selection's δ) — [`measured`]. Their **reuse key**
//! adds the policy of every table read and the identity of its data as it is now
//! ([`crate::plan::fingerprint::DataIdentity`]: a file rewritten is other data), so a release is never reused for
//! other data, under another policy, at another ρ or with another mechanism. The noisy measurements are stored under
//! the reuse key in the ledger, beside request ids but in a namespace of their own
//! ([`crate::accounting::ledger::LedgerKey`]: no caller's request id names a reuse key), with the same guarantees
//! (one charge, first draw wins, durable with a SQLite ledger); a budget (a ledger, an analyst on the server) never
//! sees another's keys. A stored draw is post-processed for a statement only when its charge names the statement's
//! private plan and the draw carries the statement's [`measured`] fingerprint. A statement that differs only after
//! the aggregate (ORDER BY, HAVING, LIMIT, expressions over the aggregates) post-processes the same measurements
//! afresh; the interval of each of its columns is computed, as always, from the charge's calibrations.
//!
//! **Shared releases.** With `[server] share_releases = true` the data owner lets a budget with no charge of its
//! own for some measurements be answered from another budget's (another analyst's): the first stored draw under
//! the same reuse key, with the charge that paid for it. Nothing new is drawn or released about the data; the
//! second analyst's budget is not charged, so per-analyst budgets then bound what each analyst asked to be
//! computed, not what each saw. Off by default. An analyst who has been disabled, or is no longer granted a table
//! the statement reads, is refused before anything is looked up ([`crate::accounting::Ledger::check_access`]), as
//! for a fresh query.
//!
//! **Why it is private.** Returning the noisy measurements of an earlier release again, or any function of them,
//! is post-processing (BS16 Lemma 1.8): it costs nothing and reveals nothing more. Drawing fresh noise for the same
//! measurements would instead let an analyst average the noise away, which is why reuse is the default. Whether a
//! statement is reused depends on the statement, the policy, the settings, the ledger and whether the data owner
//! changed the table's files since (the identity above), never on the rows.

use crate::accounting::calibrate::Calibration;
use crate::config::Reuse;
use crate::error::Result;
use crate::plan::fingerprint::{Canon, Fingerprint};
use crate::session::DpSession;
use crate::session::prepare::Prepared;
use datafusion::common::TableReference;

/// The fingerprint of what `prepared` measures with the noise `cals` (module docs): what its draw carries.
pub(crate) fn measured(prepared: &Prepared, cals: &[Calibration]) -> Result<Fingerprint> {
    let mut c = Canon::new("measurements");
    c.fingerprint(prepared.physical.fingerprint()).fingerprint(&prepared.dp.fingerprint()?).value(cals)?;
    Ok(c.finish())
}

impl DpSession {
    /// This session with reuse on (`true`: the default) or off (`false`: every query is charged and drawn afresh,
    /// as `[session] reuse = "off"`); `SET dp.reuse` still changes it.
    pub fn with_reuse(mut self, exact: bool) -> Self {
        self.defaults.reuse = if exact { Reuse::Exact } else { Reuse::Off };
        self
    }

    /// This session with reuse answering, when this budget has no charge for the measurements, from another budget
    /// of the same ledger that has (`[server] share_releases = true`; off by default: see the module docs).
    pub fn with_shared_releases(mut self, share: bool) -> Self {
        self.defaults.share_releases = share;
        self
    }

    /// The reuse key of `what` (a fingerprint of what a release measures) over the tables `tables` (module docs):
    /// with each table's policy and the identity of its data now.
    pub(crate) fn reuse_key(&self, what: &Fingerprint, tables: &[TableReference]) -> Result<Fingerprint> {
        let mut c = Canon::new("reuse key");
        c.fingerprint(what);
        self.write_tables(&mut c, tables)?;
        Ok(c.finish())
    }

    /// Writes each table of `tables`, with its policy (a private table's) and the identity of its data now.
    pub(crate) fn write_tables(&self, c: &mut Canon, tables: &[TableReference]) -> Result<()> {
        c.u64(tables.len() as u64);
        for t in tables {
            let name = t.table();
            c.str(name);
            match self.policies.get(name) {
                Some(policy) => c.u64(1).policy(policy)?,
                None => c.u64(0),
            };
            let identity = self.identities.get(name).ok_or_else(|| {
                crate::error::DpError::Internal(format!("table {name} was registered without its data's identity"))
            })?;
            c.fingerprint(&identity.now(name)?);
        }
        Ok(())
    }

    /// With reuse on and releases shared: the stored measurements of another budget under reuse key `key`, when
    /// this budget has none of its own (its own are claimed as usual). Decided from the ledger only.
    pub(crate) fn shared_prior(&self, key: &Fingerprint) -> Result<Option<crate::accounting::ledger::Prior>> {
        use crate::accounting::ledger::{LedgerKey, Prior};
        if !(self.defaults.share_releases && self.reuse().exact()) {
            return Ok(None);
        }
        if !matches!(self.ledger.prior(&LedgerKey::Reuse(*key))?, Prior::None) {
            return Ok(None);
        }
        Ok(self.ledger.shared_draw(key)?.map(|(charge, body)| Prior::Drawn(charge, body)))
    }

    /// The session's reuse as `SHOW dp.reuse` gives it: `exact`, `derive` or `off`.
    pub fn reuse_setting(&self) -> &'static str {
        self.reuse().name()
    }

    /// The session's `SET dp.reuse`, else the configuration's `[session] reuse` (exact unless set otherwise).
    pub(crate) fn reuse(&self) -> Reuse {
        self.options().reuse.as_deref().and_then(|r| Reuse::parse(r).ok()).unwrap_or(self.defaults.reuse)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuse_settings_parse() {
        assert_eq!(Reuse::parse("exact"), Ok(Reuse::Exact));
        assert_eq!(Reuse::parse(" OFF "), Ok(Reuse::Off));
        assert_eq!(Reuse::parse("Derive"), Ok(Reuse::Derive));
        assert!(Reuse::Derive.exact() && Reuse::Exact.exact() && !Reuse::Off.exact());
        assert!(Reuse::parse("sometimes").is_err());
    }
}
