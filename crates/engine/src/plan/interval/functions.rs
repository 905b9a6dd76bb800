//! The scalar functions [`super::derive`] bounds, each with the rule that makes it total. Any other function is
//! refused unless [`crate::plan::safety::total`] lists it (dpfusion's own functions).

use super::{
    Bounds, Env, Fact, Range, derive_in, facts, int_type_range, literal, narrow, of_type, point, shown, ty, ulps, union,
};
use crate::plan::computed::{Clamp, Tabulated, Where};
use crate::plan::safety;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::logical_expr::Expr;
use datafusion::logical_expr::expr::ScalarFunction;

/// The string functions that cannot fail on any text (with literal arguments where [`text`] says so).
const TEXT: &[&str] = &[
    "upper",
    "lower",
    "btrim",
    "ltrim",
    "rtrim",
    "trim",
    "initcap",
    "reverse",
    "concat",
    "concat_ws",
    "left",
    "right",
    "substr",
    "substring",
    "lpad",
    "rpad",
];

pub(super) fn function(e: &Expr, f: &ScalarFunction, schema: &DFSchema, env: &Env) -> Result<Bounds, String> {
    let name = f.name();
    if safety::listed_function(f) {
        safety::total(e, schema)?;
        return Ok(Bounds::other(true));
    }
    let args = |env: &Env| f.args.iter().map(|a| derive_in(a, schema, env)).collect::<Result<Vec<_>, String>>();
    let out = ty(e, schema)?;
    let refused = || format!("`{}`: dpfusion cannot bound {name} here", shown(e));
    match (name, f.args.as_slice()) {
        // The clamp of a bounded column (`plan::computed`): inside its literal bounds.
        ("dp_clamp", [x, Expr::Literal(lo, _), Expr::Literal(hi, _)]) if f.func.inner().is::<Clamp>() => {
            let a = derive_in(x, schema, env)?;
            let (Some(lo), Some(hi)) = (point(lo), point(hi)) else { return Err(refused()) };
            let range = match (a.range.clone(), lo, hi) {
                (Range::Int(l, h), Range::Int(lo, _), Range::Int(hi, _)) => {
                    Range::Int(l.clamp(lo, hi), h.clamp(lo, hi))
                }
                (Range::Float(l, h), Range::Float(lo, _), Range::Float(hi, _)) => {
                    Range::Float(l.max(lo).min(hi), h.max(lo).min(hi))
                }
                (Range::Time(l, h), Range::Time(lo, _), Range::Time(hi, _)) => {
                    Range::Time(l.clamp(lo, hi), h.clamp(lo, hi))
                }
                (Range::Empty, ..) => Range::Empty,
                _ => return Err(refused()),
            };
            Ok(Bounds { range, loose: None, ..a })
        }
        // `x` where `p` holds, else NULL (`plan::computed::Where`, a FILTER's run form): `x` is evaluated on every
        // row, so it must be total without `p`'s facts; its values are those of `x` where `p` holds.
        ("dp_where", [p, x]) if f.func.inner().is::<Where>() => {
            derive_in(p, schema, env)?;
            derive_in(x, schema, env)?;
            let mut here = env.clone();
            facts(p, true, &mut here);
            Ok(Bounds { may_null: true, ..derive_in(x, schema, &here)? })
        }
        // A tabulated computed column (`plan::computed::Tabulated`): one of its table's values.
        ("dp_table", [x]) if f.func.inner().is::<Tabulated>() => {
            let Some(t) = f.func.inner().downcast_ref::<Tabulated>() else { return Err(refused()) };
            derive_in(x, schema, env)?;
            let (_, table) = t.parts();
            let mut b = Bounds::of(Range::Empty);
            for i in 0..table.len() {
                let v = literal(&ScalarValue::try_from_array(table, i).map_err(|_| refused())?);
                b = Bounds {
                    range: union(&b.range, &v.range),
                    may_null: b.may_null || v.may_null,
                    may_nan: b.may_nan || v.may_nan,
                    loose: None,
                };
            }
            Ok(b)
        }
        ("abs", [_]) => {
            let a = args(env)?.remove(0);
            let range = match a.range {
                Range::Int(lo, hi) => {
                    let (tl, _) = int_type_range(&out).ok_or_else(refused)?;
                    if lo == tl && tl < 0 {
                        return Err(super::overflow(e, &a, &out));
                    }
                    magnitude_int(lo, hi)
                }
                Range::Float(lo, hi) => {
                    let (l, h) = (lo.abs(), hi.abs());
                    if lo <= 0.0 && 0.0 <= hi { Range::Float(0.0, l.max(h)) } else { Range::Float(l.min(h), l.max(h)) }
                }
                Range::Empty => Range::Empty,
                Range::Time(..) | Range::Other => return Err(refused()),
            };
            Ok(Bounds { range, ..a })
        }
        ("least" | "greatest", [_, ..]) => Ok(extreme(args(env)?, name == "greatest")),
        ("coalesce", [_, ..]) => {
            let all = args(env)?;
            let may_null = all.iter().all(|b| b.may_null);
            Ok(all.into_iter().fold(Bounds::of(Range::Empty), |acc, b| Bounds {
                range: union(&acc.range, &b.range),
                may_null,
                may_nan: acc.may_nan || b.may_nan,
                loose: acc.loose.or(b.loose),
            }))
        }
        ("nullif", [x, v]) => {
            let (a, b) = (derive_in(x, schema, env)?, derive_in(v, schema, env)?);
            if ty(x, schema)? != ty(v, schema)? {
                return Err(format!("`{}` compares values of different types", shown(e)));
            }
            let a = match v {
                Expr::Literal(v, _) => point(v).map_or(a.clone(), |p| narrow(a.clone(), &Fact::Ne(p))),
                _ => a,
            };
            let _ = b;
            Ok(Bounds { may_null: true, ..a })
        }
        ("floor" | "ceil" | "round" | "trunc", [x, rest @ ..]) => rounding(e, name, x, rest, &out, schema, env),
        ("power" | "pow", [x, c]) => power(e, x, c, schema, env),
        ("sqrt", [x]) => {
            let a = derive_in(x, schema, env)?;
            let Range::Float(lo, hi) = a.range else { return Err(refused()) };
            // DataFusion fails on a negative value (a NaN passes, as NaN).
            if lo < 0.0 {
                return Err(format!(
                    "`{}` takes the square root of a value that can be negative, which fails",
                    shown(e)
                ));
            }
            let range = Range::Float(ulps(lo.sqrt(), 1, false).max(0.0), ulps(hi.sqrt(), 1, true));
            Ok(Bounds { range, ..a })
        }
        ("date_part", [Expr::Literal(part, _), d]) => {
            let a = derive_in(d, schema, env)?;
            let part = part.to_string().to_lowercase();
            let Some(fixed) = super::time::PARTS.iter().find(|p| p.name == part).map(|p| p.fixed) else {
                let parts: Vec<&str> = super::time::PARTS.iter().map(|p| p.name).collect();
                return Err(format!("`{}`: EXTRACT reads the parts {}", shown(e), parts.join(", ")));
            };
            let of_period = match a.range {
                Range::Time(lo, hi) => super::time::part(&part, lo, hi),
                _ => None,
            };
            let known = of_period.or(fixed).map(|(lo, hi)| Range::Int(lo, hi));
            let range = match (known, out.is_integer()) {
                (Some(r), true) => r,
                (Some(Range::Int(lo, hi)), false) => Range::Float(lo as f64, hi as f64),
                _ => of_type(&out),
            };
            let bounded = !matches!(range, Range::Int(lo, hi) if int_type_range(&out) == Some((lo, hi)))
                && !matches!(range, Range::Float(lo, _) if lo.is_infinite());
            Ok(Bounds {
                range,
                // Arrow reads an instant outside the calendar's range as NULL.
                may_null: a.may_null || !matches!(a.range, Range::Time(lo, hi) if super::time::in_calendar(lo, hi)),
                may_nan: false,
                loose: (!bounded).then(|| format!("the {part} of {}", shown(d))),
            })
        }
        ("date_trunc", [Expr::Literal(granularity, _), d]) => {
            let a = derive_in(d, schema, env)?;
            let granularity = granularity.to_string().to_lowercase();
            if !super::time::TRUNCATIONS.iter().any(|(g, _)| *g == granularity) {
                let known: Vec<&str> = super::time::TRUNCATIONS.iter().map(|(g, _)| *g).collect();
                return Err(format!("`{}`: date_trunc truncates to {}", shown(e), known.join(", ")));
            }
            let range = match a.range {
                Range::Time(lo, hi) => super::time::truncate(&granularity, lo, hi, &out),
                Range::Empty => Some(Range::Empty),
                _ => None,
            };
            let Some(range) = range else {
                return Err(match &a.loose {
                    Some(c) => {
                        format!("`{}` could fail: `{c}` has no bounds (declare them: bounds = [first, last])", shown(e))
                    }
                    None => format!("`{}` could fail on some instants", shown(e)),
                });
            };
            Ok(Bounds { range, may_nan: false, loose: None, ..a })
        }
        (name, [x, rest @ ..]) if TEXT.contains(&name) => text(e, name, x, rest, schema, env),
        ("character_length" | "char_length" | "length" | "octet_length" | "bit_length", [x]) => {
            let a = derive_in(x, schema, env)?;
            let (_, th) = int_type_range(&out).ok_or_else(refused)?;
            Ok(Bounds { range: Range::Int(0, th), may_null: a.may_null, may_nan: false, loose: Some(shown(e)) })
        }
        _ => Err(format!("the function `{name}`")),
    }
}

/// `|x|` over `[lo, hi]`.
fn magnitude_int(lo: i128, hi: i128) -> Range {
    if lo >= 0 {
        Range::Int(lo, hi)
    } else if hi <= 0 {
        Range::Int(-hi, -lo)
    } else {
        Range::Int(0, (-lo).max(hi))
    }
}

/// LEAST (or GREATEST): the smallest (largest) non-NULL argument, NULL only when all are. Its upper (lower) bound is
/// the tightest among the arguments that are never NULL, and never beyond the loosest.
fn extreme(all: Vec<Bounds>, greatest: bool) -> Bounds {
    let may_null = all.iter().all(|b| b.may_null);
    let may_nan = all.iter().any(|b| b.may_nan);
    let loose = all.iter().find_map(|b| b.loose.clone());
    let range = all.iter().fold(Range::Empty, |acc, b| union(&acc, &b.range));
    let never_null: Vec<&Range> = all.iter().filter(|b| !b.may_null).map(|b| &b.range).collect();
    let range = match range {
        Range::Int(lo, hi) => {
            let tight = never_null.iter().filter_map(|r| if let Range::Int(l, h) = r { Some((*l, *h)) } else { None });
            if greatest {
                Range::Int(tight.map(|(l, _)| l).max().map_or(lo, |t| t.max(lo)), hi)
            } else {
                Range::Int(lo, tight.map(|(_, h)| h).min().map_or(hi, |t| t.min(hi)))
            }
        }
        Range::Float(lo, hi) => {
            let tight =
                never_null.iter().filter_map(|r| if let Range::Float(l, h) = r { Some((*l, *h)) } else { None });
            if greatest {
                Range::Float(tight.map(|(l, _)| l).fold(lo, f64::max), hi)
            } else {
                Range::Float(lo, tight.map(|(_, h)| h).fold(hi, f64::min))
            }
        }
        other => other,
    };
    // A bound of the result that one never-NULL argument fixes is a bound, even when another argument is loose.
    let bounded = matches!(range, Range::Int(lo, hi) if lo.abs() <= super::EXACT && hi.abs() <= super::EXACT)
        || matches!(range, Range::Float(lo, hi) if lo.is_finite() && hi.is_finite());
    Bounds { range, may_null, may_nan, loose: if bounded { None } else { loose } }
}

/// The literal integer argument of a function (the places of ROUND, the length of SUBSTR, ...).
fn literal_int(e: &Expr) -> Option<i64> {
    let v = match e {
        Expr::Literal(v, _) => v.clone(),
        Expr::Cast(c) => match c.expr.as_ref() {
            Expr::Literal(v, _) => v.cast_to(c.field.data_type()).ok()?,
            _ => return None,
        },
        _ => return None,
    };
    match v.cast_to(&DataType::Int64).ok()? {
        ScalarValue::Int64(Some(i)) => Some(i),
        _ => None,
    }
}

/// FLOOR, CEIL, ROUND and TRUNC: monotone on floats (ROUND and TRUNC to `n` places move a value by at most
/// `10^-n`); on integers (ROUND and TRUNC keep the type) the identity, refused with negative places (which can
/// overflow).
fn rounding(
    e: &Expr,
    name: &str,
    x: &Expr,
    rest: &[Expr],
    out: &DataType,
    schema: &DFSchema,
    env: &Env,
) -> Result<Bounds, String> {
    let a = derive_in(x, schema, env)?;
    let places = match rest {
        [] => None,
        [p] => Some(literal_int(p).ok_or_else(|| format!("`{}`: the number of places must be a literal", shown(e)))?),
        _ => return Err(format!("`{}`", shown(e))),
    };
    let range = match a.range {
        Range::Int(lo, hi) if out.is_integer() => {
            if places.is_some_and(|p| p < 0) {
                return Err(format!("`{}` rounds an integer to negative places, which can overflow", shown(e)));
            }
            Range::Int(lo, hi)
        }
        Range::Float(lo, hi) => match places {
            None | Some(0) => {
                let f = |v: f64| match name {
                    "floor" => v.floor(),
                    "ceil" => v.ceil(),
                    "round" => v.round(),
                    _ => v.trunc(),
                };
                Range::Float(f(lo), f(hi))
            }
            Some(p) => {
                let step = 10f64.powi(i32::try_from(-p.clamp(-400, 400)).unwrap_or(0));
                Range::Float(ulps(lo - step, 2, false), ulps(hi + step, 2, true))
            }
        },
        Range::Empty => Range::Empty,
        _ => return Err(format!("`{}`: dpfusion cannot bound {name} here", shown(e))),
    };
    Ok(Bounds { range: super::outward_to(range, out), ..a })
}

/// POWER(x, c) with a constant exponent (DataFusion computes it in Float64, and fails on 0 to a negative power).
fn power(e: &Expr, x: &Expr, c: &Expr, schema: &DFSchema, env: &Env) -> Result<Bounds, String> {
    let a = derive_in(x, schema, env)?;
    // An exponent that is one value wherever it is not NULL or NaN (a constant, usually).
    let c = derive_in(c, schema, env)?;
    let exponent = match c.range {
        Range::Float(l, h) if l == h => l,
        Range::Int(l, h) if l == h => l as f64,
        _ => return Err(format!("`{}`: POWER needs a constant exponent", shown(e))),
    };
    let Range::Float(lo, hi) = a.range else {
        return if a.range == Range::Empty { Ok(a) } else { Err(format!("`{}`", shown(e))) };
    };
    if exponent == 0.0 {
        return Ok(Bounds { range: Range::Float(1.0, 1.0), may_nan: false, loose: None, ..a });
    }
    if exponent < 0.0 && lo <= 0.0 && 0.0 <= hi {
        return Err(format!("`{}` raises a value that can be 0 to a negative power, which fails", shown(e)));
    }
    let integer = exponent.fract() == 0.0 && exponent.abs() < 9.007_199_254_740_992e15;
    let p = |v: f64| v.powf(exponent);
    let (range, nan) = if integer {
        let even = (exponent / 2.0).fract() == 0.0;
        let (l, h) = (p(lo), p(hi));
        if even && lo < 0.0 && 0.0 < hi && exponent > 0.0 {
            ((0.0, l.max(h)), false)
        } else {
            ((l.min(h), l.max(h)), false)
        }
    } else {
        // A negative base to a fractional power is NaN; the rest is monotone in the base.
        let l = lo.max(0.0);
        if exponent < 0.0 && l == 0.0 {
            return Err(format!("`{}` raises a value that can be 0 to a negative power, which fails", shown(e)));
        }
        let (a0, a1) = (p(l), p(hi.max(0.0)));
        ((a0.min(a1), a0.max(a1)), lo < 0.0)
    };
    let range = Range::Float(ulps(range.0, 4, false), ulps(range.1, 4, true));
    Ok(Bounds { range, may_nan: a.may_nan || c.may_nan || nan, may_null: a.may_null || c.may_null, ..a })
}

/// The string functions of [`TEXT`]: total on any text when their other arguments are literals (and SUBSTR's
/// length is not negative, which fails).
fn text(e: &Expr, name: &str, x: &Expr, rest: &[Expr], schema: &DFSchema, env: &Env) -> Result<Bounds, String> {
    let mut may_null = derive_in(x, schema, env)?.may_null;
    for r in rest {
        may_null |= derive_in(r, schema, env)?.may_null;
    }
    if matches!(name, "substr" | "substring")
        && let [_, len] = rest
        && literal_int(len).is_none_or(|l| l < 0)
    {
        return Err(format!("`{}`: SUBSTR needs a literal length of at least 0", shown(e)));
    }
    if matches!(name, "left" | "right" | "lpad" | "rpad") && rest.first().and_then(literal_int).is_none() {
        return Err(format!("`{}`: {} needs a literal length", shown(e), name.to_uppercase()));
    }
    if matches!(name, "lpad" | "rpad") && rest.first().and_then(literal_int).is_some_and(|n| n > 10_000) {
        return Err(format!("`{}` pads to more than 10000 characters", shown(e)));
    }
    Ok(Bounds::other(may_null))
}
