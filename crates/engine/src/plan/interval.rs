//! Bounds propagated through scalar expressions, and the proof that an expression cannot fail.
//!
//! [`derive`] walks a typed (analyzed) expression and returns, for its values, a [`Range`] (integers as exact
//! `i128` intervals, floats as `f64` intervals rounded outward), whether it may be NULL or NaN, and which column
//! left it unbounded, if one did. It fails, naming the sub-expression, when some value of the columns it reads
//! could make the expression fail at run time (an integer overflow, a division by an interval that holds 0, a cast
//! that does not fit, `0` to a negative power): the same rule as [`crate::plan::safety::total`], which calls this
//! module for every operation whose totality depends on the values (integer arithmetic, `ABS`, narrowing casts,
//! `CASE`, the numeric functions).
//!
//! **Where bounds come from.** Only from the expression itself: a column is as wide as its type, unless a
//! condition narrows it or a clamp bounds it. The planner writes every bounded column a computed value reads as the
//! clamp `dp_clamp(c, lo, hi)` ([`crate::plan::computed::Clamp`]): so the bound is a fact of the plan that runs,
//! whatever the data (a value outside its declared bounds is clamped, as everywhere in dpfusion), and the same
//! derivation re-checks the optimized plan before anything is spent (as it would `CASE WHEN c < lo THEN lo WHEN
//! c > hi THEN hi ELSE c END`, whose ELSE branch runs only where `lo ≤ c ≤ hi`).
//!
//! **Soundness.** For every row, the value of the expression is NULL (only if `may_null`), NaN (only if
//! `may_nan`), or inside `range`; and evaluating it raises no error. The rules, per operation:
//! * integers: exact `i128` arithmetic on the endpoints (the corners of `+ − ×`; truncating `/` and `%` are
//!   monotone in each argument on either side of 0); an operation is total only if its whole result range fits the
//!   output type (DataFusion wraps `+ − ×` silently and fails `/`, `%` on 0 and on `MIN / −1`);
//! * floats: each endpoint is one correctly rounded IEEE 754 operation, moved outward by one ulp unless it was
//!   exact (checked with an error-free transformation: two-sum or a fused multiply-add); `power` and `sqrt` are
//!   widened by four ulps (libm is not correctly rounded); NaN is tracked, never compared;
//! * `CASE`: the union of its branches, each narrowed by what its conditions say about literal comparisons
//!   (`c < v`, `c = v`, `BETWEEN`, `AND` of these; under `NOT`, and in later branches and `ELSE`, their negations),
//!   which is sound because DataFusion evaluates a branch (and a later condition) only on the rows that reach it.
//!   Arrow compares floats in a total order (-0.0 < 0.0, NaN above every number), so comparisons of floats narrow
//!   as non-strict ones, and NaN is never assumed away;
//! * NULL is never inside a range: `may_null` carries it. `Range::Empty` is an expression that is always NULL.
//!
//! The design follows the range propagation of Qrlew (github.com/Qrlew/qrlew, `data_type/function.rs`) with the
//! failures that library does not model made explicit, as the sensitivity analysis of Casacuberta et al.,
//! "Widespread underestimation of sensitivity in differentially private libraries" (CCS 2022), asks: the
//! sensitivities that rest on these bounds use the exact grid sums of [`crate::plan::exact_sum`].

mod functions;
#[cfg(test)]
mod tests;
mod time;
pub(crate) use time::reads_only_dates;

use crate::plan::safety;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::logical_expr::{BinaryExpr, Expr, ExprSchemable, Operator};

/// Integer bounds beyond ±2^53 do not count as bounds: they are not exact as `f64`, and a sum over them could
/// not be calibrated anyway.
const EXACT: i128 = 1 << 53;

/// The values an expression takes, NULL and NaN aside.
#[derive(Clone, Debug, PartialEq)]
pub enum Range {
    /// No value: the expression is always NULL.
    Empty,
    /// Integers in `[lo, hi]`.
    Int(i128, i128),
    /// Floats in `[lo, hi]` (the endpoints may be infinite).
    Float(f64, f64),
    /// Dates and timestamps (without a time zone) in `[lo, hi]`, in microseconds since 1970-01-01 00:00:00
    /// ([`time`]).
    Time(i128, i128),
    /// Values this module does not order (text, booleans): only the expression's totality was proven.
    Other,
}

/// What [`derive`] knows about an expression's values.
#[derive(Clone, Debug, PartialEq)]
pub struct Bounds {
    /// The non-NULL, non-NaN values.
    pub range: Range,
    /// Whether the value may be NULL.
    pub may_null: bool,
    /// Whether the value may be NaN.
    pub may_nan: bool,
    /// The first column the value reads without a bound (neither declared nor narrowed): why the range is as wide
    /// as the type.
    pub loose: Option<String>,
}

impl Bounds {
    fn of(range: Range) -> Bounds {
        Bounds { range, may_null: false, may_nan: false, loose: None }
    }

    fn other(may_null: bool) -> Bounds {
        Bounds { may_null, ..Bounds::of(Range::Other) }
    }

    /// `[lo, hi]` when the value is bounded: a finite float range, or an integer one within ±2^53, read through no
    /// unbounded column. An always-NULL value is bounded by `[0, 0]`.
    pub fn finite(&self) -> Option<(f64, f64)> {
        if self.loose.is_some() {
            return None;
        }
        match self.range {
            Range::Empty => Some((0.0, 0.0)),
            Range::Int(lo, hi) if lo.abs() <= EXACT && hi.abs() <= EXACT => Some((lo as f64, hi as f64)),
            Range::Float(lo, hi) if lo.is_finite() && hi.is_finite() => Some((lo, hi)),
            _ => None,
        }
    }

    /// The number of integer values of an integer range, when it is bounded.
    pub fn integer_count(&self) -> Option<u128> {
        match self.range {
            Range::Int(lo, hi) if self.loose.is_none() => u128::try_from(hi - lo + 1).ok(),
            _ => None,
        }
    }
}

/// A fact a condition establishes about an expression: it lies in a range, or differs from a value.
#[derive(Clone, Debug)]
enum Fact {
    In(Range),
    Ne(Range),
}

/// The facts that hold where a sub-expression is evaluated.
type Env = Vec<(Expr, Fact)>;

/// The bounds of `e`'s values (see the module docs), or a description of the sub-expression that could fail on
/// some value. `schema` is the schema `e` is evaluated against.
pub fn derive(e: &Expr, schema: &DFSchema) -> Result<Bounds, String> {
    derive_in(e, schema, &Env::new())
}

fn derive_in(e: &Expr, schema: &DFSchema, env: &Env) -> Result<Bounds, String> {
    let mut b = node(e, schema, env)?;
    let e = crate::plan::validate::strip_aliases(e);
    for (x, fact) in env {
        if x == e {
            b = narrow(b, fact);
        }
    }
    Ok(b)
}

/// `e` as the analyst wrote it, for messages: SQL, with each clamp of a column ([`crate::plan::computed`]) shown
/// as the column, and columns without their table.
pub fn shown(e: &Expr) -> String {
    use datafusion::common::tree_node::{Transformed, TreeNode};
    let unclamped = e
        .clone()
        .transform_up(|x| {
            if let Expr::ScalarFunction(f) = &x
                && f.func.inner().is::<crate::plan::computed::Clamp>()
                && let Some(col) = f.args.first()
            {
                return Ok(Transformed::yes(col.clone()));
            }
            match x {
                Expr::Column(c) => Ok(Transformed::yes(Expr::Column(datafusion::common::Column::from_name(c.name)))),
                x => Ok(Transformed::no(x)),
            }
        })
        .map_or_else(|_| e.clone(), |t| t.data);
    sql(&unclamped)
}

/// `e` as SQL (DataFusion's unparser, without the brackets around the whole), or as DataFusion prints it.
fn sql(e: &Expr) -> String {
    use datafusion::sql::sqlparser::ast;
    match datafusion::sql::unparser::expr_to_sql(e) {
        Ok(ast::Expr::Nested(inner)) => inner.to_string(),
        Ok(other) => other.to_string(),
        Err(_) => e.to_string(),
    }
}

/// The physical expression DataFusion runs for `e` over `schema`: simplified first, as the optimizer simplifies the
/// plans that run (some functions, COALESCE among them, exist only before that).
pub(crate) fn physical(
    e: &Expr,
    schema: &DFSchema,
) -> datafusion::error::Result<std::sync::Arc<dyn datafusion::physical_expr::PhysicalExpr>> {
    use datafusion::logical_expr::simplify::SimplifyContext;
    use datafusion::optimizer::simplify_expressions::ExprSimplifier;
    let context = SimplifyContext::builder().with_schema(std::sync::Arc::new(schema.clone())).build();
    let simplified = ExprSimplifier::new(context).simplify(e.clone())?;
    datafusion::physical_expr::create_physical_expr(
        &simplified,
        schema,
        &datafusion::execution::context::ExecutionProps::new(),
        &datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext::default(),
    )
}

fn ty(e: &Expr, schema: &DFSchema) -> Result<DataType, String> {
    e.get_type(schema).map_err(|err| format!("`{}` (its type is unknown: {err})", shown(e)))
}

/// The range of a type, and whether it is one this module orders.
fn of_type(t: &DataType) -> Range {
    match int_type_range(t) {
        Some((lo, hi)) => Range::Int(lo, hi),
        None if t.is_floating() => Range::Float(f64::NEG_INFINITY, f64::INFINITY),
        None => time::type_range(t).unwrap_or(Range::Other),
    }
}

/// The smallest and largest values of an integer type.
pub fn int_type_range(t: &DataType) -> Option<(i128, i128)> {
    use DataType::*;
    Some(match t {
        Int8 => (i8::MIN.into(), i8::MAX.into()),
        Int16 => (i16::MIN.into(), i16::MAX.into()),
        Int32 => (i32::MIN.into(), i32::MAX.into()),
        Int64 => (i64::MIN.into(), i64::MAX.into()),
        UInt8 => (0, u8::MAX.into()),
        UInt16 => (0, u16::MAX.into()),
        UInt32 => (0, u32::MAX.into()),
        UInt64 => (0, u64::MAX.into()),
        _ => return None,
    })
}

/// A literal as a one-point range (None for NULL, NaN and unordered types).
fn point(v: &ScalarValue) -> Option<Range> {
    use ScalarValue::*;
    let i = |x: Option<i128>| x.map(|x| Range::Int(x, x));
    match v {
        Int8(x) => i(x.map(i128::from)),
        Int16(x) => i(x.map(i128::from)),
        Int32(x) => i(x.map(i128::from)),
        Int64(x) => i(x.map(i128::from)),
        UInt8(x) => i(x.map(i128::from)),
        UInt16(x) => i(x.map(i128::from)),
        UInt32(x) => i(x.map(i128::from)),
        UInt64(x) => i(x.map(i128::from)),
        Float32(Some(x)) if !x.is_nan() => Some(Range::Float(f64::from(*x), f64::from(*x))),
        Float64(Some(x)) if !x.is_nan() => Some(Range::Float(*x, *x)),
        _ => time::point(v),
    }
}

fn literal(v: &ScalarValue) -> Bounds {
    if v.is_null() {
        return Bounds { may_null: true, ..Bounds::of(Range::Empty) };
    }
    match point(v) {
        Some(r) => Bounds::of(r),
        None if matches!(v, ScalarValue::Float32(_) | ScalarValue::Float64(_)) => {
            Bounds { may_nan: true, ..Bounds::of(Range::Empty) }
        }
        None => Bounds::other(false),
    }
}

fn node(e: &Expr, schema: &DFSchema, env: &Env) -> Result<Bounds, String> {
    // A constant (checked by `safety::check_constants` before anything runs) is its value.
    if safety::is_constant(e) && !matches!(e, Expr::Literal(..)) {
        let v = safety::evaluate_constant(e).map_err(|err| format!("`{}` ({err})", shown(e)))?;
        return Ok(literal(&v));
    }
    match e {
        Expr::Alias(a) => derive_in(&a.expr, schema, env),
        Expr::Column(c) => {
            let t = ty(e, schema)?;
            let range = of_type(&t);
            let numeric = !matches!(range, Range::Other);
            Ok(Bounds {
                range,
                may_null: e.nullable(schema).unwrap_or(true),
                may_nan: t.is_floating(),
                loose: numeric.then(|| c.name.clone()),
            })
        }
        Expr::Literal(v, _) => Ok(literal(v)),
        Expr::BinaryExpr(b) => binary(e, b, schema, env),
        Expr::Negative(x) => {
            let a = derive_in(x, schema, env)?;
            let t = ty(e, schema)?;
            let range = match a.range {
                Range::Int(lo, hi) => {
                    let (tl, th) = int_type_range(&t).ok_or_else(|| format!("`{}` on {t}", shown(e)))?;
                    if lo == tl || -lo > th {
                        return Err(overflow(e, &a, &t));
                    }
                    Range::Int(-hi, -lo)
                }
                Range::Float(lo, hi) => Range::Float(-hi, -lo),
                Range::Empty => Range::Empty,
                Range::Time(..) | Range::Other => return Err(format!("`{}`, a unary minus on {t}", shown(e))),
            };
            Ok(Bounds { range, ..a })
        }
        Expr::Cast(c) => cast(e, &c.expr, c.field.data_type(), false, schema, env),
        Expr::TryCast(c) => cast(e, &c.expr, c.field.data_type(), true, schema, env),
        Expr::Case(c) => case(c, schema, env),
        Expr::ScalarFunction(f) => functions::function(e, f, schema, env),
        // Conditions and the rest: total by the rules of `safety::total` (which never hands these back here).
        _ => {
            safety::total(e, schema)?;
            Ok(Bounds::other(true))
        }
    }
}

fn overflow(e: &Expr, a: &Bounds, t: &DataType) -> String {
    match &a.loose {
        Some(c) => format!("`{}` could overflow {t}: `{c}` has no bounds", shown(e)),
        None => format!("`{}` could overflow {t}", shown(e)),
    }
}

fn binary(e: &Expr, b: &BinaryExpr, schema: &DFSchema, env: &Env) -> Result<Bounds, String> {
    use Operator::*;
    match b.op {
        Plus | Minus | Multiply | Divide | Modulo => {
            let (x, y) = (derive_in(&b.left, schema, env)?, derive_in(&b.right, schema, env)?);
            arithmetic(e, b.op, x, y, &ty(e, schema)?)
        }
        Eq | NotEq | Lt | LtEq | Gt | GtEq | IsDistinctFrom | IsNotDistinctFrom | And | Or => {
            let (x, y) = (derive_in(&b.left, schema, env)?, derive_in(&b.right, schema, env)?);
            let (lt, rt) = (ty(&b.left, schema)?, ty(&b.right, schema)?);
            if !matches!(b.op, And | Or) && lt != rt && !lt.is_null() && !rt.is_null() {
                return Err(format!("a comparison between different types ({}: {lt} and {rt})", shown(e)));
            }
            let may_null = !matches!(b.op, IsDistinctFrom | IsNotDistinctFrom) && (x.may_null || y.may_null);
            Ok(Bounds::other(may_null))
        }
        _ => {
            safety::total(e, schema)?;
            Ok(Bounds::other(true))
        }
    }
}

fn arithmetic(e: &Expr, op: Operator, a: Bounds, b: Bounds, out: &DataType) -> Result<Bounds, String> {
    let may_null = a.may_null || b.may_null;
    let loose = a.loose.clone().or_else(|| b.loose.clone());
    // An operand that is only ever NULL or NaN makes the result NULL or NaN.
    if a.range == Range::Empty || b.range == Range::Empty {
        return Ok(Bounds { range: Range::Empty, may_null, may_nan: a.may_nan || b.may_nan, loose });
    }
    let range = match (&a.range, &b.range) {
        (&Range::Int(al, ah), &Range::Int(bl, bh)) if out.is_integer() => {
            let (tl, th) = int_type_range(out).ok_or_else(|| format!("`{}` on {out}", shown(e)))?;
            let r = int_arithmetic(e, op, (al, ah), (bl, bh), tl)?;
            match r {
                Some((lo, hi)) if lo >= tl && hi <= th => Range::Int(lo, hi),
                _ => return Err(overflow(e, if a.loose.is_some() { &a } else { &b }, out)),
            }
        }
        (&Range::Float(al, ah), &Range::Float(bl, bh)) if out.is_floating() => {
            let (range, nan) = float_arithmetic(op, (al, ah), (bl, bh));
            let range = outward_to(range, out);
            return Ok(Bounds { range, may_null, may_nan: a.may_nan || b.may_nan || nan, loose });
        }
        _ => return Err(format!("`{}`: {op} on values dpfusion cannot bound ({out})", shown(e))),
    };
    Ok(Bounds { range, may_null, may_nan: false, loose })
}

/// Integer `+ − × / %` over `[al, ah]` and `[bl, bh]` as DataFusion computes them; `None` when the result could
/// leave `i128` (it then leaves every output type too); an error when `/` or `%` could fail.
fn int_arithmetic(
    e: &Expr,
    op: Operator,
    (al, ah): (i128, i128),
    (bl, bh): (i128, i128),
    type_min: i128,
) -> Result<Option<(i128, i128)>, String> {
    use Operator::*;
    let corners = |f: fn(i128, i128) -> Option<i128>| -> Option<(i128, i128)> {
        let c = [f(al, bl)?, f(al, bh)?, f(ah, bl)?, f(ah, bh)?];
        Some((*c.iter().min()?, *c.iter().max()?))
    };
    if matches!(op, Divide | Modulo) {
        if bl <= 0 && 0 <= bh {
            let divisor = match e {
                Expr::BinaryExpr(b) => shown(&b.right),
                _ => "a value".into(),
            };
            return Err(format!(
                "`{}` divides by `{divisor}`, which can be 0 (write NULLIF({divisor}, 0), or bound it away from 0)",
                shown(e)
            ));
        }
        if al == type_min && type_min < 0 && bl <= -1 && -1 <= bh {
            return Err(format!("`{}` could overflow: the smallest value divided by -1", shown(e)));
        }
    }
    Ok(match op {
        Plus => al.checked_add(bl).zip(ah.checked_add(bh)),
        Minus => al.checked_sub(bh).zip(ah.checked_sub(bl)),
        Multiply => corners(i128::checked_mul),
        Divide => corners(i128::checked_div),
        Modulo => {
            // The remainder takes the dividend's sign and is smaller than the divisor in magnitude.
            let m = bl.abs().max(bh.abs()) - 1;
            Some((if al >= 0 { 0 } else { al.max(-m) }, if ah <= 0 { 0 } else { ah.min(m) }))
        }
        _ => None,
    })
}

/// Float `+ − × / %` (rounded outward where inexact) and whether it can produce NaN.
fn float_arithmetic(op: Operator, (al, ah): (f64, f64), (bl, bh): (f64, f64)) -> (Range, bool) {
    use Operator::*;
    let infinite = !(al.is_finite() && ah.is_finite() && bl.is_finite() && bh.is_finite());
    let pairs = [(al, bl), (al, bh), (ah, bl), (ah, bh)];
    let all = || Range::Float(f64::NEG_INFINITY, f64::INFINITY);
    let rounded = |f: fn(f64, f64) -> (f64, bool), ps: &[(f64, f64)]| -> Range {
        let mut lo = f64::INFINITY;
        let mut hi = f64::NEG_INFINITY;
        for &(x, y) in ps {
            let (v, exact) = f(x, y);
            if v.is_nan() {
                return all();
            }
            lo = lo.min(if exact { v } else { v.next_down() });
            hi = hi.max(if exact { v } else { v.next_up() });
        }
        Range::Float(lo, hi)
    };
    match op {
        Plus => (rounded(two_sum, &[(al, bl), (ah, bh)]), infinite),
        Minus => (rounded(|x, y| two_sum(x, -y), &[(al, bh), (ah, bl)]), infinite),
        Multiply => (rounded(exact_mul, &pairs), infinite),
        Divide if bl <= 0.0 && 0.0 <= bh => (all(), true),
        Divide => (rounded(exact_div, &pairs), infinite),
        Modulo => {
            let m = bl.abs().max(bh.abs());
            let r = if al >= 0.0 {
                Range::Float(0.0, ah.min(m))
            } else if ah <= 0.0 {
                Range::Float(al.max(-m), 0.0)
            } else {
                Range::Float(al.max(-m), ah.min(m))
            };
            (r, infinite || (bl <= 0.0 && 0.0 <= bh))
        }
        _ => (all(), true),
    }
}

/// `x + y` and whether it is exact (Knuth's two-sum: the rounding error is exactly representable).
fn two_sum(x: f64, y: f64) -> (f64, bool) {
    let s = x + y;
    if !s.is_finite() {
        return (s, false);
    }
    let bb = s - x;
    let err = (x - (s - bb)) + (y - bb);
    (s, err == 0.0)
}

/// Smallest magnitude of a product or quotient whose exactness the fused multiply-add decides (no underflow in the
/// rounding error): 2^-969.
const NO_UNDERFLOW: f64 = 2.004168360008973e-292;

/// `x × y` and whether it is exact (the fused multiply-add gives the exact rounding error).
fn exact_mul(x: f64, y: f64) -> (f64, bool) {
    let p = x * y;
    let exact =
        p.is_finite() && ((p == 0.0 && (x == 0.0 || y == 0.0)) || (p.abs() >= NO_UNDERFLOW && x.mul_add(y, -p) == 0.0));
    (p, exact)
}

/// `x / y` and whether it is exact (the remainder `x − q·y` of a correctly rounded quotient is representable).
fn exact_div(x: f64, y: f64) -> (f64, bool) {
    let q = x / y;
    let exact = q.is_finite() && ((q == 0.0 && x == 0.0) || (q.abs() >= NO_UNDERFLOW && q.mul_add(y, -x) == 0.0));
    (q, exact)
}

/// A float range of f64 endpoints as the output type holds it: Float32 results are rounded to f32, so their
/// range is widened to the f32 values around it.
fn outward_to(r: Range, out: &DataType) -> Range {
    match (r, out) {
        (Range::Float(lo, hi), DataType::Float32) => {
            let down = |x: f64| f64::from((x as f32).next_down());
            let up = |x: f64| f64::from((x as f32).next_up());
            Range::Float(down(lo), up(hi))
        }
        (r, _) => r,
    }
}

/// `n` ulps below/above `x` (for results of functions that are not correctly rounded).
pub(crate) fn ulps(x: f64, n: u32, up: bool) -> f64 {
    (0..n).fold(x, |v, _| if up { v.next_up() } else { v.next_down() })
}

/// An integer as the nearest f64 at or below (`up` false) or above it.
fn int_to_f64(i: i128, up: bool) -> f64 {
    let f = i as f64;
    let exact = f.is_finite() && (f as i128) == i && i.abs() <= EXACT;
    if exact { f } else { ulps(f, 1, up) }
}

fn cast(e: &Expr, inner: &Expr, to: &DataType, try_cast: bool, schema: &DFSchema, env: &Env) -> Result<Bounds, String> {
    let a = derive_in(inner, schema, env)?;
    let from = ty(inner, schema)?;
    let fails = || match &a.loose {
        Some(c) => format!("`{}`, a CAST from {from} to {to} that fails on some values: `{c}` has no bounds", shown(e)),
        None => format!("`{}`, a CAST from {from} to {to} that fails on some values", shown(e)),
    };
    let whole = |a: &Bounds| Bounds {
        range: of_type(to),
        may_null: true,
        may_nan: to.is_floating(),
        loose: a.loose.clone().or_else(|| Some(shown(inner))),
    };
    // A NaN does not cast to an integer (it fails); NULL casts to NULL.
    if a.may_nan && int_type_range(to).is_some() && !try_cast {
        return Err(fails());
    }
    if a.range == Range::Empty {
        return Ok(Bounds {
            range: Range::Empty,
            may_null: a.may_null || a.may_nan,
            may_nan: a.may_nan && to.is_floating(),
            ..a
        });
    }
    if let Some((tl, th)) = int_type_range(to) {
        let fits = match a.range {
            Range::Int(lo, hi) => (lo >= tl && hi <= th).then_some((lo, hi)),
            Range::Float(lo, hi) if !a.may_nan && lo.is_finite() && hi.is_finite() => {
                let (l, h) = (lo.trunc() as i128, hi.trunc() as i128);
                (l >= tl && h <= th).then_some((l, h))
            }
            Range::Other if from == DataType::Boolean => Some((0, 1)),
            _ => None,
        };
        return match fits {
            Some((lo, hi)) => Ok(Bounds { range: Range::Int(lo, hi), may_nan: false, ..a }),
            None if try_cast => Ok(whole(&a)),
            None => Err(fails()),
        };
    }
    if to.is_floating() {
        let range = match a.range {
            Range::Int(lo, hi) => Range::Float(int_to_f64(lo, false), int_to_f64(hi, true)),
            Range::Float(lo, hi) => Range::Float(lo, hi),
            Range::Other if from == DataType::Boolean => Range::Float(0.0, 1.0),
            _ if try_cast || safety::cast_is_total(&from, to) => return Ok(whole(&a)),
            _ => return Err(fails()),
        };
        return Ok(Bounds { range: outward_to(range, to), ..a });
    }
    // Dates and timestamps: the instants fit the target type.
    if let Range::Time(lo, hi) = a.range
        && let Some(range) = time::cast(lo, hi, to)
    {
        return Ok(Bounds { range, may_nan: false, ..a });
    }
    if try_cast || safety::cast_is_total(&from, to) {
        return Ok(Bounds { range: Range::Other, may_null: a.may_null || try_cast, may_nan: false, loose: None });
    }
    Err(fails())
}

fn case(c: &datafusion::logical_expr::expr::Case, schema: &DFSchema, env: &Env) -> Result<Bounds, String> {
    let mut out = Bounds::of(Range::Empty);
    let add = |b: Bounds, out: &mut Bounds| {
        out.range = union(&out.range, &b.range);
        out.may_null |= b.may_null;
        out.may_nan |= b.may_nan;
        if out.loose.is_none() {
            out.loose = b.loose;
        }
    };
    // The facts that hold where a later condition, branch or ELSE is evaluated: every earlier condition was not
    // true there.
    let mut not_before = env.clone();
    if let Some(x) = &c.expr {
        // CASE x WHEN v THEN ...: each WHEN compares x with its value; no narrowing.
        derive_in(x, schema, env)?;
    }
    for (w, t) in &c.when_then_expr {
        derive_in(w, schema, &not_before)?;
        let mut here = not_before.clone();
        if c.expr.is_none() {
            facts(w, true, &mut here);
        }
        add(derive_in(t, schema, &here)?, &mut out);
        if c.expr.is_none() {
            facts(w, false, &mut not_before);
        }
    }
    match &c.else_expr {
        Some(x) => add(derive_in(x, schema, &not_before)?, &mut out),
        None => out.may_null = true,
    }
    Ok(out)
}

/// The union of two ranges (`Empty` is neutral).
pub fn union(a: &Range, b: &Range) -> Range {
    match (a, b) {
        (Range::Empty, r) | (r, Range::Empty) => r.clone(),
        (&Range::Int(a0, a1), &Range::Int(b0, b1)) => Range::Int(a0.min(b0), a1.max(b1)),
        (&Range::Float(a0, a1), &Range::Float(b0, b1)) => Range::Float(a0.min(b0), a1.max(b1)),
        (&Range::Time(a0, a1), &Range::Time(b0, b1)) => Range::Time(a0.min(b0), a1.max(b1)),
        (&Range::Int(a0, a1), &Range::Float(b0, b1)) | (&Range::Float(b0, b1), &Range::Int(a0, a1)) => {
            Range::Float(int_to_f64(a0, false).min(b0), int_to_f64(a1, true).max(b1))
        }
        _ => Range::Other,
    }
}

/// Adds to `out` what `cond` being true (`positive`) or not true (false or NULL) says about literal comparisons.
fn facts(cond: &Expr, positive: bool, out: &mut Env) {
    use Operator::*;
    match crate::plan::validate::strip_aliases(cond) {
        Expr::Not(x) => facts(x, !positive, out),
        Expr::BinaryExpr(b) if (b.op == And && positive) || (b.op == Or && !positive) => {
            facts(&b.left, positive, out);
            facts(&b.right, positive, out);
        }
        Expr::BinaryExpr(b) => {
            let (x, op, v) = match (b.left.as_ref(), b.right.as_ref()) {
                (x, Expr::Literal(v, _)) if !matches!(x, Expr::Literal(..)) => (x, b.op, v),
                (Expr::Literal(v, _), x) => match b.op.swap() {
                    Some(op) => (x, op, v),
                    None => return,
                },
                _ => return,
            };
            let op = if positive {
                op
            } else {
                match op.negate() {
                    Some(op) => op,
                    None => return,
                }
            };
            let Some(p) = point(v) else { return };
            let fact = match op {
                Eq => Fact::In(p),
                NotEq => Fact::Ne(p),
                Lt => Fact::In(side(&p, false, true)),
                LtEq => Fact::In(side(&p, false, false)),
                Gt => Fact::In(side(&p, true, true)),
                GtEq => Fact::In(side(&p, true, false)),
                _ => return,
            };
            out.push((crate::plan::validate::strip_aliases(x).clone(), fact));
        }
        Expr::Between(b) if !b.negated && positive => {
            if let (Expr::Literal(lo, _), Expr::Literal(hi, _)) = (b.low.as_ref(), b.high.as_ref())
                && let (Some(lo), Some(hi)) = (point(lo), point(hi))
            {
                let x = crate::plan::validate::strip_aliases(&b.expr).clone();
                out.push((x.clone(), Fact::In(side(&lo, true, false))));
                out.push((x, Fact::In(side(&hi, false, false))));
            }
        }
        _ => {}
    }
}

/// The values above (`above`) or below a point, strictly or not.
fn side(p: &Range, above: bool, strict: bool) -> Range {
    match *p {
        Range::Int(v, _) => {
            let s = i128::from(strict);
            if above { Range::Int(v + s, i128::MAX) } else { Range::Int(i128::MIN, v - s) }
        }
        Range::Time(v, _) => {
            let s = i128::from(strict);
            if above { Range::Time(v + s, i128::MAX) } else { Range::Time(i128::MIN, v - s) }
        }
        // Arrow orders floats totally (-0.0 < 0.0, NaN above everything): `x < 0.0` holds for x = -0.0, which is
        // not below 0.0 numerically. So a strict comparison of floats narrows as a non-strict one.
        Range::Float(v, _) => {
            if above {
                Range::Float(v, f64::INFINITY)
            } else {
                Range::Float(f64::NEG_INFINITY, v)
            }
        }
        _ => Range::Other,
    }
}

/// `b` where `fact` holds. A fact that leaves nothing (a branch no non-NULL value reaches) narrows nothing.
fn narrow(b: Bounds, fact: &Fact) -> Bounds {
    let range = match (&b.range, fact) {
        (&Range::Int(lo, hi), Fact::In(Range::Int(fl, fh))) => Range::Int(lo.max(*fl), hi.min(*fh)),
        (&Range::Float(lo, hi), Fact::In(Range::Float(fl, fh))) => Range::Float(lo.max(*fl), hi.min(*fh)),
        (&Range::Time(lo, hi), Fact::In(Range::Time(fl, fh))) => Range::Time(lo.max(*fl), hi.min(*fh)),
        (&Range::Int(lo, hi), Fact::Ne(Range::Int(v, _))) if lo < hi => {
            Range::Int(if lo == *v { lo + 1 } else { lo }, if hi == *v { hi - 1 } else { hi })
        }
        // (Not for 0: under Arrow's total order -0.0 differs from 0.0, and is numerically equal to it.)
        (&Range::Float(lo, hi), Fact::Ne(Range::Float(v, _))) if lo < hi && *v != 0.0 => {
            Range::Float(if lo == *v { lo.next_up() } else { lo }, if hi == *v { hi.next_down() } else { hi })
        }
        _ => return b,
    };
    let empty = match range {
        Range::Int(lo, hi) | Range::Time(lo, hi) => lo > hi,
        Range::Float(lo, hi) => lo > hi,
        _ => false,
    };
    if empty {
        return b;
    }
    let bounded = match range {
        Range::Int(lo, hi) => lo.abs() <= EXACT && hi.abs() <= EXACT,
        Range::Float(lo, hi) => lo.is_finite() && hi.is_finite(),
        Range::Time(lo, hi) => time::in_calendar(lo, hi),
        _ => false,
    };
    Bounds { range, loose: if bounded { None } else { b.loose }, ..b }
}
