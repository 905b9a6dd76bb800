//! Answering a query: debit, run the private plan, draw the noise once, post-process, release.
//!
//! **One charge, at most one draw of noise, ever** (per request id). The debit claims the request id in the same
//! transaction ([`crate::accounting::ledger::Ledger::claim`]); the noisy measurements (after noise, before any
//! post-processing) are stored durably, first writer wins, before anything derived from them leaves the process;
//! every retry, and every concurrent duplicate, post-processes the stored values. A run that loses the race to
//! store discards its own draw unseen. Nothing stores a noise *seed*: the same noise on re-read data would reveal
//! how the data changed.
//!
//! Neighbouring relation: add/remove all rows of one privacy unit.

use crate::accounting::calibrate::Calibration;
use crate::accounting::ledger::{Claim, LedgerKey, Prior};
use crate::accounting::{Charge, Debit};
use crate::config::Reuse;
use crate::error::{DpError, Result, engine};
use crate::marginals::{Counter, MarginalRelease, RowSampler};
use crate::noise::NoiseParams;
use crate::noise::Ratio;
use crate::noise::exponential::{Exponential, QuantileScores};
use crate::noise::gaussian::DiscreteGaussian;
use crate::noise::laplace::DiscreteLaplace;
use crate::plan::fingerprint::Fingerprint;
use crate::plan::{DpPlan, MeasureKind};
use crate::refusal::Refusal;
use crate::release::{Parts, Release};
use crate::session::accuracy::{Halves, column_accuracy, is_interval_column, selection_note};
use crate::session::marginals::PreparedMarginals;
use crate::session::post::{PostFailure, domain_product, named_aggregates, noisy_batch, passthrough};
use crate::session::prepare::Prepared;
use crate::session::quote::Quote;
use crate::session::{DpSession, PrivatePlan, Unlocked};
use datafusion::arrow::array::{Array, AsArray, Decimal128Array, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{Float64Type, SchemaRef};
use datafusion::common::ScalarValue;
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::Arc;

/// The noisy measurements of one query as stored under its key: the canonical fingerprint of what they measure
/// ([`super::reuse::measured`]), then `values[cell][measurement]` in grid units, cells in the order of
/// [`domain_product`] or, for keys without a domain, of the released keys, stored after the values (an Arrow IPC
/// stream of one batch).
pub(crate) struct Draw {
    fingerprint: Fingerprint,
    pub(super) values: Vec<Vec<i128>>,
    /// The released keys of a selection (one row per cell of `values`); None: the product of the domains.
    keys: Option<RecordBatch>,
}

const DRAW_MAGIC: &[u8; 8] = b"dpdraw03";
/// A draw followed by its released keys.
const DRAW_KEYS_MAGIC: &[u8; 8] = b"dpdraw04";
/// The formats of older dpfusions (a 128-bit hash of printed plans, without or with released keys).
const OLD_MAGICS: [&[u8; 8]; 2] = [b"dpdraw01", b"dpdraw02"];

impl Draw {
    /// The values of a plan's cells (what they measure: `fingerprint`), in the order of [`domain_product`].
    pub(super) fn of_cells(fingerprint: Fingerprint, values: Vec<Vec<i128>>) -> Draw {
        Draw { fingerprint, values, keys: None }
    }

    /// The fingerprint of what the values measure.
    pub(super) fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    /// The keys of the cells, in the order of the values.
    fn cells(&self, dp: &DpPlan) -> Result<Vec<Vec<ScalarValue>>> {
        let Some(keys) = &self.keys else { return Ok(domain_product(dp)) };
        (0..keys.num_rows())
            .map(|r| keys.columns().iter().map(|c| ScalarValue::try_from_array(c, r).map_err(engine)).collect())
            .collect()
    }

    fn to_bytes(&self) -> Result<Vec<u8>> {
        let m = self.values.first().map_or(0, Vec::len);
        let mut out = Vec::with_capacity(HEAD + self.values.len() * m * 16);
        out.extend_from_slice(if self.keys.is_some() { DRAW_KEYS_MAGIC } else { DRAW_MAGIC });
        out.extend_from_slice(self.fingerprint.as_bytes());
        out.extend_from_slice(&(self.values.len() as u64).to_le_bytes());
        out.extend_from_slice(&(m as u64).to_le_bytes());
        for cell in &self.values {
            for v in cell {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        if let Some(keys) = &self.keys {
            // Its length first, so that a stream cut short is refused rather than read in part.
            let ipc =
                |e: datafusion::arrow::error::ArrowError| DpError::Internal(format!("storing released keys: {e}"));
            let mut stream = Vec::new();
            let mut w =
                datafusion::arrow::ipc::writer::StreamWriter::try_new(&mut stream, &keys.schema()).map_err(ipc)?;
            w.write(keys).map_err(ipc)?;
            w.finish().map_err(ipc)?;
            drop(w);
            out.extend_from_slice(&(stream.len() as u64).to_le_bytes());
            out.extend_from_slice(&stream);
        }
        Ok(out)
    }

    pub(super) fn from_bytes(b: &[u8]) -> Result<Draw> {
        let bad = || DpError::Ledger("a stored draw of noisy values is unreadable".into());
        let word = |at: usize| b.get(at..at + 8).and_then(|w| <[u8; 8]>::try_from(w).ok()).map(u64::from_le_bytes);
        let with_keys = match b.get(..8) {
            Some(m) if m == DRAW_MAGIC.as_slice() => false,
            Some(m) if m == DRAW_KEYS_MAGIC.as_slice() => true,
            Some(m) if OLD_MAGICS.iter().any(|old| m == old.as_slice()) => {
                return Err(DpError::Ledger(
                    "these noisy values were stored by an older dpfusion, which identified what they measure by a \
                     hash of printed text: they cannot be checked against this statement, so they are not used \
                     (nothing was spent); ask with a new request id"
                        .into(),
                ));
            }
            _ => return Err(bad()),
        };
        let fingerprint = b.get(8..40).and_then(|w| <[u8; 32]>::try_from(w).ok()).map(Fingerprint::from_bytes);
        let (fingerprint, cells, m) =
            (fingerprint.ok_or_else(bad)?, word(40).ok_or_else(bad)?, word(48).ok_or_else(bad)?);
        let (cells, m) = (usize::try_from(cells).map_err(|_| bad())?, usize::try_from(m).map_err(|_| bad())?);
        let len = cells.checked_mul(m).and_then(|n| n.checked_mul(16)).ok_or_else(bad)?;
        let body = b.get(HEAD..HEAD.checked_add(len).ok_or_else(bad)?).ok_or_else(bad)?;
        let rest = b.get(HEAD + len..).unwrap_or_default();
        let keys = match (with_keys, rest.is_empty()) {
            (false, true) => None,
            (true, false) => {
                let stream = rest.get(8..).ok_or_else(bad)?;
                let len = rest.get(..8).and_then(|w| <[u8; 8]>::try_from(w).ok()).map(u64::from_le_bytes);
                if len != Some(stream.len() as u64) {
                    return Err(bad());
                }
                let mut r = datafusion::arrow::ipc::reader::StreamReader::try_new(stream, None).map_err(|_| bad())?;
                let keys = r.next().ok_or_else(bad)?.map_err(|_| bad())?;
                if keys.num_rows() != cells {
                    return Err(bad());
                }
                Some(keys)
            }
            _ => return Err(bad()),
        };
        let mut it = body.chunks_exact(16).map(|c| <[u8; 16]>::try_from(c).map(i128::from_le_bytes));
        let values = (0..cells)
            .map(|_| (0..m).map(|_| it.next().and_then(|v| v.ok()).ok_or_else(bad)).collect::<Result<Vec<_>>>())
            .collect::<Result<Vec<_>>>()?;
        Ok(Draw { fingerprint, values, keys })
    }
}

/// Bytes of a stored draw before its values: magic, fingerprint, cells, measurements.
const HEAD: usize = 8 + 32 + 8 + 8;

/// What to do after looking at the request id.
enum Next {
    /// Run under this debit and draw the noise.
    Run(Debit),
    /// Post-process these stored noisy values, drawn under this charge (nothing is read again).
    Stored(Charge, Draw),
    /// Return this stored release.
    Done(Box<Release>),
    /// Post-process these sums of a stored release's cells (`SET dp.reuse = 'derive'`: nothing is charged).
    Derived(Box<super::derive::Derived>),
}

/// The refusal of a request id retried with another statement than the one it was charged for.
pub(super) fn another_query(id: &str, charge: &Charge) -> DpError {
    DpError::Refused(Refusal::RequestIdReused { id: id.to_string(), charge: charge.id() })
}

impl DpSession {
    /// Answers one query: prepare and price it (all checks, nothing spent), debit, then [`DpSession::release`].
    /// `params` are the values of its `$n` placeholders; the charge's label (and the release's SQL) is the query
    /// with them ([`labelled`]), so a request id retried with other values is another query.
    pub(crate) async fn query(&self, sql: &str, params: &[ScalarValue], request_id: Option<&str>) -> Result<Release> {
        let text = sql;
        let label = labelled(sql, params);
        let sql = label.as_str();
        // A stored release is returned as it is: no planning, so a later change of the policy cannot alter it; the
        // analyst must still be allowed every table it read.
        if let Some(id) = request_id
            && let Prior::Released(charge, bytes) = self.ledger.prior(&LedgerKey::Request(id.to_string()))?
        {
            self.ledger.check_access(charge.tables())?;
            return stored_release(id, sql, charge, &bytes);
        }
        if let Some((g, p)) = self.prepare_grouping(text, params).await? {
            return super::grow_stack(self.answer_grouping(sql, g, p, request_id)).await;
        }
        let prepared = self.prepare(text, params).await?;
        let quote = self.quote(&prepared.dp)?;
        let mut tables: Vec<String> = prepared.dp.tables.iter().map(|t| t.table().to_string()).collect();
        tables.sort();
        tables.dedup();
        // Every answer, fresh or not, to an analyst the data owner still allows these tables.
        self.ledger.check_access(&tables)?;
        // Over the budget with a target: refused with what the budget left would give.
        let for_target = |e: DpError| match &quote.target {
            Some(solved) => self.target_over_budget(e, &prepared.dp, solved, quote.confidence),
            None => e,
        };
        // Execution and post-processing recurse over the plan's expressions as planning does: on the same large
        // stack (a statement's depth is bounded by MAX_OPERATORS before it is parsed; this is the margin). So does
        // the fingerprint, which encodes the plan.
        super::grow_stack(async {
            let measured = super::reuse::measured(&prepared, &quote.measurements)?;
            // Without a request id, the measurements are stored under their reuse key ([`super::reuse`]): the same
            // measurements asked again are answered from them.
            let mut keyed = match request_id {
                Some(id) => Some(Keyed { key: LedgerKey::Request(id.to_string()), shared: false, index: None }),
                None if self.reuse().exact() => {
                    let key = self.reuse_key(&measured, &prepared.dp.tables)?;
                    // What else its draw can answer, recorded with it ([`super::derive`]).
                    let index = self.draw_index(&prepared, &quote.measurements, sql, &measured)?;
                    Some(Keyed { key: LedgerKey::Reuse(key), shared: false, index })
                }
                None => None,
            };
            // With `[server] share_releases`, measurements another budget paid for (and this one did not).
            let shared = match keyed.as_mut() {
                Some(Keyed { key: LedgerKey::Reuse(key), shared, .. }) => {
                    let prior = self.shared_prior(key)?;
                    *shared = prior.is_some();
                    prior
                }
                _ => None,
            };
            // With `SET dp.reuse = 'derive'`, measurements never charged but summed from a stored release's cells.
            if self.reuse() == Reuse::Derive
                && shared.is_none()
                && let Some(k) = keyed.as_ref().filter(|k| !k.request())
                && matches!(self.ledger.prior(&k.key)?, Prior::None)
                && let Some(derived) = self.derivation(&prepared.dp, quote.confidence, &measured)?
            {
                let next = Next::Derived(Box::new(derived));
                return self.release(sql, &prepared, next, None, &quote, &measured).await;
            }
            let plans = [*prepared.physical.fingerprint()];
            let claimed = match (&keyed, shared) {
                (Some(k), Some(prior)) => stored(k, sql, &prepared, &measured, &quote, prior),
                (None, _) => self.ledger.charge(sql, &tables, quote.measurements.clone(), &plans).map(Next::Run),
                (Some(k), None) => match self.ledger.claim(sql, &k.key, &tables, quote.measurements.clone(), &plans) {
                    Ok(Claim::New(debit)) => Ok(Next::Run(debit)),
                    Ok(Claim::Resumed(debit)) => resume(k, sql, &prepared, &quote, debit),
                    Ok(Claim::Existing(prior)) => stored(k, sql, &prepared, &measured, &quote, prior),
                    Err(e) => Err(e),
                },
            };
            let next = claimed.map_err(for_target)?;
            self.release(sql, &prepared, next, keyed.as_ref(), &quote, &measured).await
        })
        .await
    }

    /// The one place a private plan runs and a [`Release`] is made: under the [`Debit`] that paid for it (taken by
    /// value: one debit, one run), the private plan runs and the noise is drawn; with a request id (or a reuse
    /// key), the draw is stored (first writer wins) before anything derived from it is computed, and with a
    /// request id the release is stored before it is returned. With noisy values stored under the charge, only
    /// those are post-processed. The `quote` gives the confidence and the query's ε (its measurements are the
    /// charge's: [`resume`] and [`stored`] refuse a retry whose price changed); `measured` is what the draw
    /// measures ([`super::reuse::measured`]).
    async fn release(
        &self,
        sql: &str,
        prepared: &Prepared,
        next: Next,
        keyed: Option<&Keyed>,
        quote: &Quote,
        measured: &Fingerprint,
    ) -> Result<Release> {
        let confidence = quote.confidence;
        let dp = &prepared.dp;
        let (charge, draw, reused, derived) = match next {
            Next::Done(r) => return Ok(*r),
            Next::Derived(d) => {
                let source = d.source();
                let super::derive::Derived { charge, draw, cals, .. } = *d;
                (charge, draw, false, Some((cals, source)))
            }
            Next::Stored(charge, draw) => (charge, draw, keyed.is_some_and(|k| !k.request()), None),
            Next::Run(debit) => {
                let (charge, draw) = self.run_private(prepared, debit, quote.selection.as_ref(), measured).await?;
                let draw = match keyed {
                    None => draw,
                    Some(k) => {
                        // First writer wins: if another run stored its draw first, that one is used, this one dropped.
                        let bytes = self.ledger.store_draw(&k.key, &draw.to_bytes()?, k.index.as_ref())?;
                        let stored = Draw::from_bytes(&bytes)?;
                        if stored.fingerprint != draw.fingerprint {
                            // Only a run under another policy can have stored another plan's draw under this id.
                            return Err(changed(&k.key, &charge, quote));
                        }
                        stored
                    }
                };
                (charge, draw, false, None)
            }
        };
        // The noise the values carry: the charge's, or for a derived answer its sums' ([`super::derive`]).
        let cals = derived.as_ref().map_or(charge.measurements(), |(cals, _)| cals.as_slice());
        let values = &draw.values;
        // Each measurement's half-width at level √c: an average's interval holds when both of its hold (p.
        // accuracy::avg_interval).
        let half = cals.iter().map(|c| Halves::of(c, confidence)).collect::<Result<Vec<_>>>()?;
        let noisy = noisy_batch(dp, draw.cells(dp)?, values, &half)?;
        // Post-processing sees only noisy values; if it fails on them, the release holds those values (paid for),
        // never an error that would lose them.
        // Nothing computed above the aggregate: the noisy table is the answer (chosen and named columns), as
        // DataFusion would have returned it.
        let post = match passthrough(dp, &noisy) {
            Some(out) => Ok(out),
            None => self.run_post(dp, noisy.clone()).await,
        };
        let (post, note) = match post {
            Ok(out) => (out, None),
            Err(failure) => {
                let why = match failure {
                    PostFailure::Planning(e) => e.to_string(),
                    PostFailure::Running(e) => crate::refusal::engine_message(&e),
                };
                let note = format!(
                    "post-processing failed on the noisy values ({why}); shown instead: the noisy aggregates this \
                     query paid for (keys, then one column per aggregate), from which the query's expressions can \
                     be computed at no cost"
                );
                let named = named_aggregates(dp, noisy)?;
                ((named.schema(), vec![named]), Some(note))
            }
        };
        let (schema, batches, hidden) = split_hidden(&post.0, post.1)?;
        let accuracy = column_accuracy(dp, cals, &schema, &batches, &hidden, confidence, note.is_some())?;
        let note = match note {
            Some(n) => Some(n),
            None => selection_note(dp, cals, &accuracy, confidence)?,
        };
        let free = reused || derived.is_some();
        let note = match (reused, derived) {
            (false, None) => note,
            (_, Some((_, source))) => {
                let first = format!("derived: {source} (SET dp.reuse = 'exact' to pay for new measurements)");
                Some(note.map_or_else(|| first.clone(), |n| format!("{first}; {n}")))
            }
            (true, None) => {
                let first = if keyed.is_some_and(|k| k.shared) {
                    format!(
                        "shared: charge #{} of another analyst's budget paid for the same measurements, so they are \
                         answered from it at no cost ([server] share_releases; SET dp.reuse = 'off' to pay for new \
                         ones)",
                        charge.id()
                    )
                } else {
                    format!(
                        "reused from charge #{}: the same measurements were released before, so they are answered \
                         again at no cost (SET dp.reuse = 'off' to pay for new ones)",
                        charge.id()
                    )
                };
                Some(match note {
                    Some(n) => format!("{first}; {n}"),
                    None => first,
                })
            }
        };
        let parts = Parts {
            sql: sql.to_string(),
            accuracy,
            schema,
            batches,
            budget: self.status()?,
            session_epsilon: self.ledger.epsilon(self.defaults.delta)?,
            query_epsilon: quote.epsilon,
            note,
            free,
        };
        let release = Release::new(parts, charge);
        if let Some(k) = keyed.filter(|k| k.request()) {
            // Stored before it is returned (unless a concurrent run stored the same answer first).
            self.ledger.store_release(&k.key, &release.to_bytes()?)?;
        }
        Ok(release)
    }
}

/// The text a query with bound parameters is recorded under (charge label, release, EXPLAIN DP): the SQL as
/// written, then one comment line with each value and its type (`-- $1 = -5 (Int64), $2 = 'x' (Utf8)`). The
/// SQL alone without parameters.
pub(crate) fn labelled(sql: &str, params: &[ScalarValue]) -> String {
    if params.is_empty() {
        return sql.to_string();
    }
    let values = params
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let text = match v {
                v if v.is_null() => "NULL".to_string(),
                ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) | ScalarValue::Utf8View(Some(s)) => {
                    format!("'{}'", s.replace('\'', "''"))
                }
                v => v.to_string(),
            };
            format!("${} = {text} ({})", i + 1, v.data_type())
        })
        .collect::<Vec<_>>()
        .join(", ");
    format!("{sql}\n-- {values}")
}

/// A stored release, read back with the charge the ledger recorded for it; refused if the id was for another query.
fn stored_release(id: &str, sql: &str, charge: Charge, bytes: &[u8]) -> Result<Release> {
    let r = Release::from_bytes(bytes, charge)?;
    if r.sql() != sql {
        return Err(another_query(id, r.charge()));
    }
    Ok(r)
}

/// Whether a charge's measurements are the quoted ones (see [`Calibration::same_noise`]).
pub(crate) fn same_noise(charged: &[Calibration], quoted: &[Calibration]) -> bool {
    charged.len() == quoted.len() && charged.iter().zip(quoted).all(|(c, q)| c.same_noise(q))
}

/// The refusal of a retry whose price or plan changed since its charge.
pub(super) fn changed(key: &LedgerKey, charge: &Charge, quote: &Quote) -> DpError {
    DpError::Refused(Refusal::PolicyChanged { id: key_text(key), charged: charge.rho().get(), quoted: quote.rho.get() })
}

/// How a refusal names a key: a request id as the caller gave it, a reuse key as `reuse key …`.
pub(super) fn key_text(key: &LedgerKey) -> String {
    match key {
        LedgerKey::Request(id) => id.clone(),
        other => other.describe(),
    }
}

/// The key a query's charge and draw are recorded under: the caller's request id (its release is stored too, and a
/// retry must be the same SQL), or the reuse key of its measurements ([`DpSession::reuse_key`]: another statement
/// with the same measurements post-processes them).
pub(crate) struct Keyed {
    key: LedgerKey,
    /// Answered from another budget's charge (`[server] share_releases`).
    shared: bool,
    /// What else the draw can answer, recorded with it (reuse keys only).
    index: Option<crate::accounting::ledger::DrawIndex>,
}

impl Keyed {
    /// Whether the key is a caller's request id.
    fn request(&self) -> bool {
        matches!(self.key, LedgerKey::Request(_))
    }
}

/// Whether `charge` paid for exactly the plans `plans` (the statement's, as planned now): a stored answer is used
/// only for the plan it was computed with. A charge recorded before dpfusion named its plans names none.
pub(super) fn names(charge: &Charge, plans: &[Fingerprint]) -> bool {
    charge.plans() == plans
}

/// A key charged before and never drawn: run under its debit, provided the query, its plan and its price
/// (`quote`) are the ones it was charged for (the noise is calibrated from the stored charge).
fn resume(k: &Keyed, sql: &str, prepared: &Prepared, quote: &Quote, debit: Debit) -> Result<Next> {
    let c = debit.charge();
    if k.request() && c.label() != sql {
        return Err(another_query(&key_text(&k.key), c));
    }
    if !same_noise(c.measurements(), &quote.measurements) || !names(c, &[*prepared.physical.fingerprint()]) {
        return Err(changed(&k.key, c, quote));
    }
    Ok(Next::Run(debit))
}

/// A key whose noise was drawn before: return its release, or post-process its stored draw, provided the query,
/// its plan, what it measures (`measured`) and its price (`quote`) are the ones it was charged for.
fn stored(
    k: &Keyed,
    sql: &str,
    prepared: &Prepared,
    measured: &Fingerprint,
    quote: &Quote,
    prior: Prior,
) -> Result<Next> {
    let id = key_text(&k.key);
    let plans = [*prepared.physical.fingerprint()];
    match prior {
        Prior::None | Prior::Charged(_) => {
            Err(DpError::Ledger(format!("{} was claimed but the ledger has no draw for it", k.key.describe())))
        }
        Prior::Released(c, bytes) => stored_release(&id, sql, c, &bytes).map(|r| Next::Done(Box::new(r))),
        Prior::Drawn(c, _) if k.request() && c.label() != sql => Err(another_query(&id, &c)),
        // The noise was calibrated from the stored charge: it must be what this query costs now, for this plan.
        Prior::Drawn(c, _) if !same_noise(c.measurements(), &quote.measurements) || !names(&c, &plans) => {
            Err(changed(&k.key, &c, quote))
        }
        Prior::Drawn(_, bytes) if bytes.is_empty() => Err(DpError::Refused(Refusal::RequestIdLost { id })),
        Prior::Drawn(c, bytes) => {
            let draw = Draw::from_bytes(&bytes)?;
            if draw.fingerprint != *measured {
                return Err(changed(&k.key, &c, quote));
            }
            Ok(Next::Stored(c, draw))
        }
    }
}

/// The units over the limit of a bounded pass (each unit's key columns and its row count), as collected.
pub(crate) type Collected = (SchemaRef, Vec<RecordBatch>);

/// Where a bounded pass ([`DpSession::count_bounded`]) finds the units over the limit: none (no privacy unit, or
/// nothing over it), their plan, to collect, or their rows collected by an earlier pass under the same debit.
#[derive(Clone, Copy)]
pub(crate) enum OverLimit<'a> {
    /// No unit can be over the limit.
    None,
    /// The plan that lists them.
    Plan(&'a PrivatePlan),
    /// What that plan listed, collected by an earlier pass.
    Collected(&'a Collected),
}

impl<'a> OverLimit<'a> {
    /// Their plan, if there is one.
    pub(crate) fn of(plan: Option<&'a PrivatePlan>) -> Self {
        plan.map_or(OverLimit::None, OverLimit::Plan)
    }
}

impl DpSession {
    /// Answers a prepared marginal release: debits its quote **before** anything is read, then runs its plans
    /// once (the per-unit row counts, then a single pass counting every cell while each unit is bounded to k
    /// random rows) and adds discrete Gaussian noise, calibrated from the charge, to every cell. The
    /// [`MarginalRelease`] is made from the charge, taken by value. See [`crate::marginals`] for the privacy claim.
    pub(crate) async fn answer_marginals(&self, prepared: PreparedMarginals) -> Result<MarginalRelease> {
        let PreparedMarginals { histograms, plan, quote, k, selection, over_limit, rows } = prepared;
        let plans: Vec<Fingerprint> = over_limit.iter().chain([&rows]).map(|p| *p.fingerprint()).collect();
        let tables = std::slice::from_ref(&histograms.table);
        let debit = self.ledger.charge(&histograms.label(), tables, quote.measurements, &plans)?;
        let open = self.tables.open(debit);
        let mut counter = Counter::new(&histograms);
        let over = OverLimit::of(over_limit.as_ref());
        self.count_bounded(&open, over, &rows, k, &histograms.table, |b| counter.add(b)).await?;
        let charge = open.close();
        let [cal] = charge.measurements() else {
            return Err(DpError::Internal("a marginal release is one measurement".into()));
        };
        let NoiseParams::Gaussian { sigma_sq } = cal.params() else {
            return Err(DpError::Internal("a marginal release uses the Gaussian mechanism".into()));
        };
        let g = DiscreteGaussian::new(sigma_sq)?;
        let threshold = selection.as_ref().map(crate::noise::Selection::threshold);
        let noisy = {
            let mut rng = self.lock_rng()?;
            counter.tallies().into_iter().map(|t| t.noised(|| g.sample(&mut rng), threshold)).collect::<Result<_>>()?
        };
        MarginalRelease::new(&histograms, noisy, plan, charge, self.status()?)
    }

    /// Streams the rows of `rows` through `count`, each unit bounded to `k` rows (a `RowSampler`, drawn afresh from
    /// the units `over_limit` lists), with the progress of `table`'s passes shown; returns those units' rows, which
    /// another pass under the same debit may take instead of collecting them again. Errors while reading are
    /// reported without their text, as in [`DpSession::run_private`].
    pub(crate) async fn count_bounded(
        &self,
        open: &Unlocked<'_>,
        over_limit: OverLimit<'_>,
        rows: &PrivatePlan,
        k: u64,
        table: &str,
        mut count: impl FnMut(&RecordBatch) -> Result<()>,
    ) -> Result<Option<Collected>> {
        let mut plans = vec![rows.physical()];
        if let OverLimit::Plan(over) = over_limit {
            plans.insert(0, over.physical());
        }
        let _running = self.start_progress(&plans, table, plans.len() as u64).await;
        let collected = match over_limit {
            OverLimit::None => None,
            OverLimit::Plan(over) => {
                Some((over.schema(), open.collect(over).await.map_err(|e| self.private_failure(e))?))
            }
            OverLimit::Collected(c) => Some(c.clone()),
        };
        let mut sampler = match &collected {
            None => None,
            Some((schema, batches)) => Some(RowSampler::new(schema, batches, k, &mut *self.lock_rng()?)?),
        };
        let mut stream = open.stream(rows).map_err(|e| self.private_failure(e))?;
        while let Some(batch) = stream.next().await {
            let mut batch = batch.map_err(|e| self.private_failure(e))?;
            if let Some(sampler) = &mut sampler {
                batch = sampler.sample(&batch)?;
            }
            count(&batch)?;
        }
        Ok(collected)
    }

    /// Runs the private plan and adds noise to every cell of the domain (cells in the order of [`domain_product`]),
    /// or, for keys without a domain, to the keys present and keeps those that pass `selection`'s threshold
    /// ([`select_cells`]). Errors while reading the data are reported without their text (which could quote a
    /// private value): the engine's error stays in the `source` for the data owner.
    async fn run_private(
        &self,
        prepared: &Prepared,
        debit: Debit,
        selection: Option<&crate::noise::Selection>,
        measured: &Fingerprint,
    ) -> Result<(Charge, Draw)> {
        let open = self.tables.open(debit);
        let running = self.start_progress(&[prepared.physical.physical()], prepared.dp.table.table(), 1).await;
        let exact = open.collect(&prepared.physical).await.map_err(|e| self.private_failure(e))?;
        drop(running);
        let charge = open.close();
        let cals = charge.measurements();
        let dp = &prepared.dp;
        let cells = exact_cells(dp, &exact)?;
        let samplers =
            cals.iter().zip(&dp.measures).map(|(c, m)| Sampler::new(c, &m.kind)).collect::<Result<Vec<_>>>()?;
        if samplers.len() != dp.measures.len() {
            return Err(DpError::Internal("the charge does not have one calibration per measurement".into()));
        }
        let mut rng = self.lock_rng()?;
        if let (Some(s), Some(selection)) = (dp.selection, selection) {
            let (keys, values) = select_cells(cells, &samplers, s, selection.threshold(), &mut rng)?;
            let keys = key_batch(dp, &keys)?;
            return Ok((charge, Draw { fingerprint: *measured, values, keys: Some(keys) }));
        }
        let noisy = domain_product(dp)
            .iter()
            .map(|key| {
                let exact = cells.get(key);
                samplers
                    .iter()
                    .enumerate()
                    .map(|(i, s)| s.draw(&mut rng, exact.and_then(|e| e.get(i))))
                    .collect::<Result<Vec<i128>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((charge, Draw { fingerprint: *measured, values: noisy, keys: None }))
    }
}

impl DpSession {
    /// An error while a private plan ran (after its debit): its text goes to the owner's log only, since it could
    /// quote a private value; the analyst gets [`DpError::PrivateExecution`].
    pub(crate) fn private_failure(&self, source: datafusion::error::DataFusionError) -> DpError {
        if let Some(log) = &self.owner_log {
            log.write(&format!("a private plan failed while reading the data: {}", source.strip_backtrace()));
        }
        DpError::PrivateExecution { source }
    }
}

/// The analyst's columns of a post-processed result, and the hidden per-row interval columns (by name) apart.
#[allow(clippy::type_complexity)]
fn split_hidden(
    schema: &SchemaRef,
    batches: Vec<RecordBatch>,
) -> Result<(SchemaRef, Vec<RecordBatch>, Vec<(String, Vec<f64>)>)> {
    let (shown, hidden): (Vec<usize>, Vec<usize>) =
        (0..schema.fields().len()).partition(|&i| !is_interval_column(schema.field(i).name()));
    if hidden.is_empty() {
        return Ok((schema.clone(), batches, vec![]));
    }
    let mut values: Vec<(String, Vec<f64>)> =
        hidden.iter().map(|&i| (schema.field(i).name().clone(), vec![])).collect();
    let mut out = Vec::with_capacity(batches.len());
    for b in &batches {
        for ((_, v), &i) in values.iter_mut().zip(&hidden) {
            let a = b
                .column(i)
                .as_primitive_opt::<Float64Type>()
                .ok_or_else(|| DpError::Internal("a hidden interval column is not Float64".into()))?;
            v.extend(a.values().iter().copied());
        }
        out.push(b.project(&shown).map_err(|e| DpError::Internal(e.to_string()))?);
    }
    Ok((Arc::new(schema.project(&shown).map_err(|e| DpError::Internal(e.to_string()))?), out, values))
}

/// One measurement's exact aggregate in one cell.
#[derive(Debug)]
enum Exact {
    /// A count or a sum, in grid units.
    Int(i128),
    /// A quantile's histogram over its grid's slots.
    Slots(Vec<u64>),
}

/// What draws one measurement's released value from its exact aggregate.
enum Sampler {
    Gaussian(DiscreteGaussian),
    Laplace(DiscreteLaplace),
    /// The exponential mechanism over a quantile's grid: the quantile and the number of slots.
    Exponential(Exponential, Ratio, usize),
}

impl Sampler {
    fn new(c: &Calibration, kind: &MeasureKind) -> Result<Sampler> {
        match (c.params(), kind) {
            (NoiseParams::Gaussian { sigma_sq }, _) => DiscreteGaussian::new(sigma_sq).map(Sampler::Gaussian),
            (NoiseParams::Laplace { scale }, _) => DiscreteLaplace::new(scale).map(Sampler::Laplace),
            (NoiseParams::Exponential { eta }, MeasureKind::Quantile { q, grid, .. }) => {
                Ok(Sampler::Exponential(Exponential::new(eta)?, *q, grid.grid()?.slots()))
            }
            (NoiseParams::Exponential { .. }, _) => {
                Err(DpError::Internal("the exponential mechanism calibrated for a count or a sum".into()))
            }
        }
    }

    /// The released value of a cell whose exact aggregate is `exact` (None: the cell has no rows): the exact value
    /// plus noise (grid units), or the index of the candidate the exponential mechanism draws.
    fn draw(&self, rng: &mut crate::noise::NoiseRng, exact: Option<&Exact>) -> Result<i128> {
        let int = || match exact {
            None => Ok(0),
            Some(Exact::Int(x)) => Ok(*x),
            Some(Exact::Slots(_)) => Err(DpError::Internal("a histogram where a count or a sum was expected".into())),
        };
        Ok(match self {
            Sampler::Gaussian(g) => int()?.saturating_add(g.sample(rng)),
            Sampler::Laplace(l) => int()?.saturating_add(l.sample(rng)),
            Sampler::Exponential(mech, q, slots) => {
                let empty = vec![0; *slots];
                let histogram = match exact {
                    None => &empty,
                    Some(Exact::Slots(h)) if h.is_empty() => &empty,
                    Some(Exact::Slots(h)) if h.len() == *slots => h,
                    Some(_) => {
                        return Err(DpError::Internal("a quantile's exact aggregate is not its histogram".into()));
                    }
                };
                let scores = QuantileScores::scores(histogram, *q)?;
                let drawn =
                    mech.sample(rng, &scores).ok_or_else(|| DpError::Internal("a grid without candidates".into()))?;
                drawn as i128
            }
        })
    }
}

/// The values of a cell's keys.
type Key = Vec<ScalarValue>;

/// The Gaussian thresholding of keys without a domain ([`crate::noise::selection`]): every key present in `cells`
/// gets noise on its selecting count (measurement `s`) and is released iff that noisy count is at least
/// `threshold`, the noisy count then being its released COUNT; only released keys get noise on their other
/// measurements. Keys are visited in their own order (sorted by value), so neither the order of the released rows
/// nor the noise they get depends on keys that are not released.
fn select_cells(
    cells: HashMap<Vec<ScalarValue>, Vec<Exact>>,
    samplers: &[Sampler],
    s: usize,
    threshold: i64,
    rng: &mut crate::noise::NoiseRng,
) -> Result<(Vec<Key>, Vec<Vec<i128>>)> {
    let selector = samplers.get(s).ok_or_else(|| DpError::Internal("no selecting measurement".into()))?;
    let mut candidates: Vec<(Vec<ScalarValue>, Vec<Exact>)> = cells.into_iter().collect();
    candidates.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal));
    let (mut keys, mut values) = (vec![], vec![]);
    for (key, exact) in candidates {
        let count = selector.draw(rng, exact.get(s))?;
        if count < i128::from(threshold) {
            continue;
        }
        let row = samplers
            .iter()
            .enumerate()
            .map(|(i, m)| if i == s { Ok(count) } else { m.draw(rng, exact.get(i)) })
            .collect::<Result<Vec<i128>>>()?;
        keys.push(key);
        values.push(row);
    }
    Ok((keys, values))
}

/// The released keys as one batch with the private plan's key columns (its first columns).
fn key_batch(dp: &DpPlan, keys: &[Vec<ScalarValue>]) -> Result<RecordBatch> {
    let fields: Vec<_> = dp.private.schema().fields().iter().take(dp.keys.len()).cloned().collect();
    let columns = fields
        .iter()
        .enumerate()
        .map(|(c, f)| {
            let values = keys.iter().map(|k| k.get(c).cloned());
            match values.collect::<Option<Vec<_>>>() {
                Some(v) if !v.is_empty() => ScalarValue::iter_to_array(v).map_err(engine),
                Some(_) => Ok(datafusion::arrow::array::new_empty_array(f.data_type())),
                None => Err(DpError::Internal("a released key with fewer values than the keys".into())),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    let schema = Arc::new(datafusion::arrow::datatypes::Schema::new(fields));
    RecordBatch::try_new(schema, columns).map_err(|e| DpError::Internal(format!("released keys: {e}")))
}

/// Reads the exact aggregates: key → one value per measurement (grid units, or a quantile's histogram).
fn exact_cells(dp: &DpPlan, batches: &[RecordBatch]) -> Result<HashMap<Vec<ScalarValue>, Vec<Exact>>> {
    let nk = dp.keys.len();
    let mut out = HashMap::new();
    for b in batches {
        for row in 0..b.num_rows() {
            let key = (0..nk)
                .map(|c| ScalarValue::try_from_array(b.column(c), row).map_err(engine))
                .collect::<Result<Vec<_>>>()?;
            let vals = dp
                .measures
                .iter()
                .enumerate()
                .map(|(m, measure)| {
                    let column = b.column(nk + m).as_ref();
                    match measure.kind {
                        MeasureKind::Quantile { .. } => exact_histogram(column, row).map(Exact::Slots),
                        _ => exact_integer(column, row).map(Exact::Int),
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            out.insert(key, vals);
        }
    }
    Ok(out)
}

/// A histogram `List<Int64>` of the private plan (empty for NULL: no values).
fn exact_histogram(a: &dyn Array, row: usize) -> Result<Vec<u64>> {
    let Some(lists) = a.as_list_opt::<i32>() else {
        return Err(DpError::Internal(format!("a quantile's histogram is {}", a.data_type())));
    };
    if lists.is_null(row) {
        return Ok(vec![]);
    }
    let counts = lists.value(row);
    let counts = counts
        .as_primitive_opt::<datafusion::arrow::datatypes::Int64Type>()
        .ok_or_else(|| DpError::Internal("a histogram of other than Int64 counts".into()))?;
    Ok(counts.iter().map(|c| c.unwrap_or(0).max(0) as u64).collect())
}

fn exact_integer(a: &dyn Array, row: usize) -> Result<i128> {
    if a.is_null(row) {
        return Ok(0); // SUM over no non-NULL value
    }
    if let Some(x) = a.as_any().downcast_ref::<Int64Array>() {
        return Ok(x.value(row) as i128);
    }
    if let Some(x) = a.as_any().downcast_ref::<Decimal128Array>() {
        return Ok(x.value(row));
    }
    Err(DpError::Internal(format!("unexpected aggregate type {}", a.data_type())))
}

#[cfg(any(test, feature = "test-util"))]
impl DpSession {
    /// **Tests only: hands out exact aggregates of private data.** Charges `sql` at its quoted price (like a query
    /// without reuse), runs its private plan once and returns, for each measurement (in the order `EXPLAIN DP`
    /// lists them), its label and its exact pre-noise value in every cell of the domain ([`domain_product`]'s
    /// order; 0 for a cell without rows), in value units: for neighbouring audits of measurements that no output
    /// column shows alone (a correlation's sums). Reachable only with the `test-util` feature, never from a
    /// configuration file or SQL; not for queries with quantiles or keys without a domain.
    pub async fn exact_measurements_for_tests(&self, sql: &str) -> Result<Vec<(String, Vec<f64>)>> {
        let prepared = self.prepare(sql, &[]).await?;
        let dp = &prepared.dp;
        let quote = self.quote(dp)?;
        let tables: Vec<String> = dp.tables.iter().map(|t| t.table().to_string()).collect();
        let plans = [*prepared.physical.fingerprint()];
        let debit = self.ledger.charge(sql, &tables, quote.measurements.clone(), &plans)?;
        let open = self.tables.open(debit);
        let exact = open.collect(&prepared.physical).await.map_err(|e| self.private_failure(e))?;
        open.close();
        let cells = exact_cells(dp, &exact)?;
        let keys = domain_product(dp);
        dp.measures
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let unit = crate::session::post::unit_of(&m.kind);
                let values = keys
                    .iter()
                    .map(|k| match cells.get(k).and_then(|c| c.get(i)) {
                        None => Ok(0.0),
                        Some(Exact::Int(x)) => Ok(*x as f64 * unit),
                        Some(Exact::Slots(_)) => Err(DpError::Internal("a quantile has no exact value".into())),
                    })
                    .collect::<Result<Vec<f64>>>()?;
                Ok((m.label(), values))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_round_trip_and_damaged_ones_are_refused() {
        let fingerprint = Fingerprint::from_bytes([7; 32]);
        let d = Draw { fingerprint, values: vec![vec![1, -2], vec![i128::MAX, i128::MIN]], keys: None };
        let b = d.to_bytes().unwrap();
        let back = Draw::from_bytes(&b).unwrap();
        assert_eq!((back.fingerprint, back.values), (d.fingerprint, d.values));
        assert!(Draw::from_bytes(&b[..b.len() - 1]).is_err());
        assert!(Draw::from_bytes(b"").is_err());
        let mut wrong = b.clone();
        wrong[0] ^= 1;
        assert!(Draw::from_bytes(&wrong).is_err());
        // A draw an older dpfusion stored (identified by a hash of printed text) is never used: it says so.
        let mut old = b"dpdraw01".to_vec();
        old.extend_from_slice(&[0; 32]);
        let e = Draw::from_bytes(&old).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("older dpfusion") && e.contains("new request id"), "{e}");
    }

    /// A selection's draw keeps its released keys with its values: they come back as they were, and a draw whose
    /// keys are cut short, or whose key count is not its cell count, is refused.
    #[test]
    fn draws_with_released_keys_round_trip() {
        use datafusion::arrow::array::StringArray;
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        let schema = Arc::new(Schema::new(vec![Field::new("zip", DataType::Utf8, true)]));
        let keys = RecordBatch::try_new(schema, vec![Arc::new(StringArray::from(vec!["02139", "ünï"]))]).unwrap();
        let fingerprint = Fingerprint::from_bytes([7; 32]);
        let d = Draw { fingerprint, values: vec![vec![12, 3], vec![40, -1]], keys: Some(keys.clone()) };
        let b = d.to_bytes().unwrap();
        assert_eq!(&b[..8], b"dpdraw04");
        let back = Draw::from_bytes(&b).unwrap();
        assert_eq!((back.values, back.keys), (d.values, Some(keys)));
        assert!(Draw::from_bytes(&b[..b.len() - 3]).is_err());
        let one = Draw { fingerprint, values: vec![vec![12, 3]], keys: d.keys.clone() };
        assert!(Draw::from_bytes(&one.to_bytes().unwrap()).is_err(), "two keys for one cell");
        let mut plain = Draw { keys: None, ..one }.to_bytes().unwrap();
        plain.extend_from_slice(b"trailing");
        assert!(Draw::from_bytes(&plain).is_err());
    }
}
