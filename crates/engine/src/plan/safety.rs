//! Run-time safety: nothing in a private plan may fail, or behave differently, because of a value in the data.
//!
//! DataFusion evaluates `a AND b` batch by batch and skips `b` when `a` is false for every row of the batch (and
//! likewise `CASE`, `COALESCE`, `OR`). If `b` could fail, the query would fail **iff some row satisfies `a`**: an
//! exact yes/no about the data, outside any noise. The rule that closes this class:
//!
//! * every sub-expression that reads no column (a constant) is evaluated before anything is spent, and the query
//!   is refused if that fails ([`check_constants`]);
//! * every expression that reads a column is **total**: it cannot fail for any value of its type
//!   ([`check_total`], [`total`]);
//! * the plan checked is the plan that runs: the session checks the private plan *after* DataFusion's analyzer
//!   and optimizer, then hands exactly that plan to the physical planner (the optimizer may remove a cast, or
//!   rewrite an IN list as ORs; it must not be able to introduce a fallible expression unseen).
//!
//! Refusals name only the query's own text and the column types (which come from the policy), so whether a query
//! is refused, and the message, never depend on the data.

use crate::error::{DpError, Result, engine};
use crate::plan::by_unit::ByUnit;
use crate::plan::cells::{CellIndex, CellKey};
use crate::plan::clip::Clipped;
use crate::plan::exact_sum::BoundedSum;
use crate::plan::pick::Priority;
use crate::plan::runs::UnitRuns;
use crate::refusal::Refusal;
use datafusion::arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions, StringArray};
use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchema, JoinType, ScalarValue};
use datafusion::execution::context::ExecutionProps;
use datafusion::functions::core::getfield::GetFieldFunc;
use datafusion::functions::math::random::RandomFunc;
use datafusion::functions_aggregate::count::Count;
use datafusion::functions_aggregate::sum::Sum;
use datafusion::logical_expr::{ColumnarValue, Expr, ExprSchemable, LogicalPlan, Operator};
use std::sync::Arc;

/// Longest LIKE pattern accepted (bytes). Real patterns are short; a huge one only costs regex compile time.
pub const MAX_LIKE_PATTERN: usize = 10_000;

/// Most operators one statement may hold: binary operators (AND, OR, comparisons, arithmetic, `||`, bitwise),
/// prefix and postfix ones (NOT, unary `-`/`+`, `IS [NOT] NULL/TRUE/...`, `::type`, `IN`, `BETWEEN`, `LIKE`,
/// `CAST`, `CASE`/`WHEN`, `COLLATE`, `AT TIME ZONE`, subscripts) and every opening parenthesis (nesting). A chain
/// of n of them is an expression tree n levels deep, and the SQL parser, the planner, the optimizer, the
/// evaluator and even dropping the tree all recurse over it: a few thousand overflow a 2 MiB thread stack and
/// abort the process (every analyst's connection with it, on the server). The items of an IN list and of a
/// function's arguments are not nested and do not count, so real queries stay far below this.
pub const MAX_OPERATORS: usize = 1000;

/// Deepest nesting accepted (see [`nesting`]). The SQL parser recurses once per level and gives up at 50
/// (DataFusion's `sql_parser.recursion_limit`); near that limit sqlparser 0.62 backtracks on every level and a
/// nest of 48 `CAST(`s took longer than any timeout (two levels fewer: 0.1 s). So deep nests are refused first,
/// well inside the parser's limit.
pub const MAX_NESTING: usize = 32;

/// How deeply a statement's tokens nest: every opening bracket and `CASE` opens a level (its closing bracket or
/// `END` closes it), and every prefix operator (NOT, unary `-`/`+`, `~`, `!`) deepens the expression that
/// follows it by one. An over-estimate of the parser's recursion for unusual texts, never an under-estimate.
fn nesting(tokens: &[datafusion::sql::sqlparser::tokenizer::Token]) -> usize {
    use datafusion::sql::sqlparser::keywords::Keyword as K;
    use datafusion::sql::sqlparser::tokenizer::Token as T;
    let mut levels: Vec<usize> = Vec::new(); // the depth each open level added
    let (mut open, mut prefixes, mut deepest) = (0usize, 0usize, 0usize);
    // Whether the previous token ends an operand, so that a following `-` is binary, not a prefix.
    let mut after_operand = false;
    for t in tokens.iter().filter(|t| !matches!(t, T::Whitespace(_))) {
        let opens = matches!(t, T::LParen | T::LBracket | T::LBrace) || matches!(t, T::Word(w) if w.keyword == K::CASE);
        let closes = matches!(t, T::RParen | T::RBracket | T::RBrace) || matches!(t, T::Word(w) if w.keyword == K::END);
        let prefix = match t {
            T::Word(w) => w.keyword == K::NOT,
            T::Minus | T::Plus => !after_operand,
            T::Tilde | T::ExclamationMark => true,
            _ => false,
        };
        if opens {
            let added = 1 + std::mem::take(&mut prefixes);
            levels.push(added);
            open += added;
        } else if closes {
            open -= levels.pop().unwrap_or(0);
            prefixes = 0;
        } else if prefix {
            prefixes += 1;
        }
        deepest = deepest.max(open + prefixes);
        // An operand (a literal, a name; a keyword may be one, e.g. a column called `year`) ends the run of
        // prefix operators before it; after a keyword, a `-` is counted as a prefix (an over-estimate at most).
        let operand = !opens && !closes && !prefix && !is_operator(t) && !matches!(t, T::Comma);
        if operand {
            prefixes = 0;
        }
        after_operand = closes || (operand && !matches!(t, T::Word(w) if w.keyword != K::NoKeyword));
    }
    deepest
}

/// Whether a token is an operator for [`MAX_OPERATORS`]: anything that can nest one expression in another.
fn is_operator(t: &datafusion::sql::sqlparser::tokenizer::Token) -> bool {
    use datafusion::sql::sqlparser::keywords::Keyword as K;
    use datafusion::sql::sqlparser::tokenizer::Token as T;
    match t {
        T::Word(w) => matches!(
            w.keyword,
            K::AND
                | K::OR
                | K::XOR
                | K::NOT
                | K::IS
                | K::IN
                | K::BETWEEN
                | K::LIKE
                | K::ILIKE
                | K::SIMILAR
                | K::REGEXP
                | K::RLIKE
                | K::CAST
                | K::TRY_CAST
                | K::SAFE_CAST
                | K::CASE
                | K::WHEN
                | K::COLLATE
                | K::AT
                | K::EXISTS
                | K::ANY
                | K::ALL
                | K::SOME
                | K::INTERVAL
                | K::OVERLAPS
                | K::DIV
                | K::MOD
        ),
        // Literals, names, separators and closing brackets nest nothing.
        T::EOF
        | T::Number(..)
        | T::Char(_)
        | T::SingleQuotedString(_)
        | T::DoubleQuotedString(_)
        | T::TripleSingleQuotedString(_)
        | T::TripleDoubleQuotedString(_)
        | T::DollarQuotedString(_)
        | T::SingleQuotedByteStringLiteral(_)
        | T::DoubleQuotedByteStringLiteral(_)
        | T::TripleSingleQuotedByteStringLiteral(_)
        | T::TripleDoubleQuotedByteStringLiteral(_)
        | T::SingleQuotedRawStringLiteral(_)
        | T::DoubleQuotedRawStringLiteral(_)
        | T::TripleSingleQuotedRawStringLiteral(_)
        | T::TripleDoubleQuotedRawStringLiteral(_)
        | T::NationalStringLiteral(_)
        | T::QuoteDelimitedStringLiteral(_)
        | T::NationalQuoteDelimitedStringLiteral(_)
        | T::EscapedStringLiteral(_)
        | T::UnicodeStringLiteral(_)
        | T::HexStringLiteral(_)
        | T::Comma
        | T::Whitespace(_)
        | T::Period
        | T::SemiColon
        | T::RParen
        | T::RBracket
        | T::RBrace
        | T::Placeholder(_) => false,
        // Every other token is punctuation that builds an expression: binary, prefix and postfix operators
        // (`+`, `=`, `::`, `->`, `~`, `!`, `@`, ...), opening brackets and whatever a dialect adds.
        _ => true,
    }
}

/// Refuses a statement with more than [`MAX_OPERATORS`] operators or nested deeper than [`MAX_NESTING`] (see
/// there), before anything parses it, from
/// the token stream, which the tokenizer produces without recursion. Every front end (library, CLI, REPL, the
/// server's routing and catalog) calls this first.
pub fn check_statement_size(sql: &str) -> Result<()> {
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::tokenizer::Tokenizer;
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, sql).tokenize() else {
        return Ok(()); // the parser reports the syntax error itself, before it builds any tree
    };
    let ops = tokens.iter().filter(|t| is_operator(t)).count();
    if ops > MAX_OPERATORS {
        return Err(DpError::Refused(Refusal::TooManyOperators { count: ops, max: MAX_OPERATORS }));
    }
    let depth = nesting(&tokens);
    if depth > MAX_NESTING {
        return Err(DpError::Refused(Refusal::TooDeep { depth, max: MAX_NESTING }));
    }
    Ok(())
}

/// Whether `e` reads no data: no column, aggregate, window, subquery, placeholder or volatile function.
pub(crate) fn is_constant(e: &Expr) -> bool {
    !e.is_volatile()
        && !e
            .exists(|x| {
                Ok(matches!(
                    x,
                    Expr::Column(_)
                        | Expr::OuterReferenceColumn(..)
                        | Expr::ScalarVariable(..)
                        | Expr::AggregateFunction(_)
                        | Expr::WindowFunction(_)
                        | Expr::ScalarSubquery(_)
                        | Expr::Exists(_)
                        | Expr::InSubquery(_)
                        | Expr::SetComparison(_)
                        | Expr::Placeholder(_)
                        | Expr::GroupingSet(_)
                        | Expr::Unnest(_)
                        | Expr::HigherOrderFunction(_)
                        | Expr::Lambda(_)
                        | Expr::LambdaVariable(_)
                ))
            })
            .unwrap_or(true)
}

/// Evaluates a constant expression (one that reads no column, aggregate, window, subquery or volatile function).
/// Functions of the query's start time (`now()`, `current_date`) are first replaced by their value now, as the
/// optimizer replaces them in the plan that runs (they cannot be invoked otherwise).
pub fn evaluate_constant(e: &Expr) -> datafusion::error::Result<ScalarValue> {
    use datafusion::logical_expr::simplify::SimplifyContext;
    use datafusion::optimizer::simplify_expressions::ExprSimplifier;
    let e = ExprSimplifier::new(SimplifyContext::builder().with_current_time().build()).simplify(e.clone())?;
    let phys = datafusion::physical_expr::create_physical_expr(
        &e,
        &DFSchema::empty(),
        &ExecutionProps::new(),
        &datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext::default(),
    )?;
    let batch = RecordBatch::try_new_with_options(
        Arc::new(Schema::empty()),
        vec![],
        &RecordBatchOptions::new().with_row_count(Some(1)),
    )?;
    match phys.evaluate(&batch)? {
        ColumnarValue::Scalar(s) => Ok(s),
        ColumnarValue::Array(a) => ScalarValue::try_from_array(&a, 0),
    }
}

/// Visits every sub-expression of every node of `plan` (subqueries included), from the top: `visit` returns
/// `None` to look inside the expression, `Some(Ok(()))` to skip what is inside it, `Some(Err(e))` to stop with `e`.
pub(crate) fn visit_expressions(plan: &LogicalPlan, mut visit: impl FnMut(&Expr) -> Option<Result<()>>) -> Result<()> {
    let mut failure: Option<DpError> = None;
    plan.apply_with_subqueries(|node| {
        node.apply_expressions(|e| {
            e.apply(|sub| {
                Ok(match visit(sub) {
                    None => TreeNodeRecursion::Continue,
                    Some(Ok(())) => TreeNodeRecursion::Jump,
                    Some(Err(err)) => {
                        failure = Some(err);
                        TreeNodeRecursion::Stop
                    }
                })
            })
        })?;
        Ok(if failure.is_some() { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
    })
    .map_err(engine)?;
    failure.map_or(Ok(()), Err)
}

/// Evaluates every constant sub-expression of every node of `plan` (its largest constant sub-trees), and refuses
/// the query if one fails: a constant that fails only when it is evaluated would otherwise fail at run time, and
/// only when the data makes DataFusion reach it. Call [`crate::plan::size::check_constant_sizes`] first, so that no
/// constant can exhaust memory while it is evaluated.
pub fn check_constants(plan: &LogicalPlan) -> Result<()> {
    visit_expressions(plan, |sub| {
        if matches!(sub, Expr::Literal(..)) || !is_constant(sub) {
            return None;
        }
        Some(evaluate_constant(sub).map(|_| ()).map_err(|err| {
            DpError::Refused(Refusal::ConstantFails {
                constant: sub.to_string(),
                error: crate::refusal::engine_message(&err),
            })
        }))
    })
}

/// Whether `CAST(x AS to)` of an `x` of type `from` succeeds for every value (no overflow, no parse).
pub fn cast_is_total(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    /// Decimal digits needed for every value of an integer type.
    fn int_digits(t: &DataType) -> Option<i16> {
        Some(match t {
            Int8 | UInt8 => 3,
            Int16 | UInt16 => 5,
            Int32 | UInt32 => 10,
            Int64 => 19,
            UInt64 => 20,
            _ => return None,
        })
    }
    fn bits(t: &DataType) -> u32 {
        match t {
            Int8 | UInt8 => 8,
            Int16 | UInt16 => 16,
            Int32 | UInt32 => 32,
            _ => 64,
        }
    }
    let signed = |t: &DataType| matches!(t, Int8 | Int16 | Int32 | Int64);
    let string = |t: &DataType| matches!(t, Utf8 | LargeUtf8 | Utf8View);
    if from == to || from.is_null() {
        return true;
    }
    match (from, to) {
        (f, t) if f.is_integer() && t.is_integer() => {
            if signed(f) == signed(t) {
                bits(t) >= bits(f)
            } else {
                !signed(f) && bits(t) > bits(f) // unsigned into a wider signed type
            }
        }
        (f, Float32 | Float64) if f.is_integer() => true,
        (f, Decimal128(p, s)) if f.is_integer() => int_digits(f).is_some_and(|d| i16::from(*p) - i16::from(*s) >= d),
        (Boolean, t) if t.is_integer() || t.is_floating() => true,
        (Float16, Float32 | Float64) | (Float32, Float64) => true,
        (Decimal128(..), Float32 | Float64) => true,
        (Decimal128(p1, s1), Decimal128(p2, s2)) => {
            s2 >= s1 && i16::from(*p2) - i16::from(*s2) >= i16::from(*p1) - i16::from(*s1)
        }
        (f, t) if string(t) && (f.is_numeric() || string(f) || matches!(f, Boolean | Date32 | Date64)) => true,
        (Date32, Date64) => true,
        (Dictionary(_, v), t) => cast_is_total(v, t),
        _ => false,
    }
}

fn string_literal(e: &Expr) -> Option<Option<&str>> {
    match e {
        Expr::Literal(ScalarValue::Utf8(s) | ScalarValue::LargeUtf8(s) | ScalarValue::Utf8View(s), _) => {
            Some(s.as_deref())
        }
        Expr::Literal(v, _) if v.is_null() => Some(None),
        // A string literal cast to another string type (the coercion of a pattern to a Utf8View column, when the
        // optimizer leaves it) is the same string.
        Expr::Cast(c) if matches!(c.field.data_type(), DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) => {
            string_literal(&c.expr)
        }
        _ => None,
    }
}

/// Checks that LIKE with this literal pattern cannot fail on any string: the pattern is short enough and its
/// matcher builds. Arrow builds the matcher from the pattern alone, once per batch, before it looks at any value,
/// so building it here on a one-value array is exactly the check.
fn check_like_pattern(pattern: &str, case_insensitive: bool) -> std::result::Result<(), String> {
    use datafusion::arrow::array::Scalar;
    use datafusion::arrow::compute::kernels::comparison::{ilike, like};
    if pattern.len() > MAX_LIKE_PATTERN {
        return Err(format!("a LIKE pattern of {} bytes (at most {MAX_LIKE_PATTERN})", pattern.len()));
    }
    let values = StringArray::from(vec![""]);
    let pat = Scalar::new(Arc::new(StringArray::from(vec![pattern])) as ArrayRef);
    let built = if case_insensitive { ilike(&values, &pat) } else { like(&values, &pat) };
    built.map(|_| ()).map_err(|e| format!("a LIKE pattern that cannot be used ({e})"))
}

/// Describes the first sub-expression of `e` that could fail on some value of the columns it reads, or `Ok` when
/// `e` is total. Constants are assumed already evaluated by [`check_constants`] (so a constant sub-expression
/// is total: it succeeded once, and evaluation is deterministic).
pub fn total(e: &Expr, schema: &DFSchema) -> std::result::Result<(), String> {
    if is_constant(e) {
        return match e {
            // A LIKE between constants is a constant too, but its pattern is checked like any other.
            Expr::Like(l) => like_total(l, schema),
            _ => Ok(()),
        };
    }
    let ty = |x: &Expr| x.get_type(schema).map_err(|err| format!("`{x}` (its type is unknown: {err})"));
    let all = |xs: &[&Expr]| xs.iter().try_for_each(|x| total(x, schema));
    match e {
        Expr::Column(_) | Expr::Literal(..) => Ok(()),
        Expr::Alias(a) => total(&a.expr, schema),
        Expr::Not(x)
        | Expr::IsNull(x)
        | Expr::IsNotNull(x)
        | Expr::IsTrue(x)
        | Expr::IsFalse(x)
        | Expr::IsNotTrue(x)
        | Expr::IsNotFalse(x)
        | Expr::IsUnknown(x)
        | Expr::IsNotUnknown(x) => total(x, schema),
        Expr::Negative(x) => {
            total(x, schema)?;
            let t = ty(x)?;
            if t.is_floating() || matches!(t, DataType::Decimal128(..)) {
                Ok(())
            } else {
                // Total when the operand's range excludes the smallest value (`plan::interval`).
                bounded(e, schema)
            }
        }
        Expr::BinaryExpr(b) => {
            use Operator::*;
            if matches!(b.op, Plus | Minus | Multiply | Divide | Modulo)
                && !(ty(&b.left)?.is_floating() && ty(&b.right)?.is_floating())
            {
                // Integer arithmetic is total when the operands' ranges prove it (`plan::interval`).
                return bounded(e, schema);
            }
            all(&[&b.left, &b.right])?;
            let (lt, rt) = (ty(&b.left)?, ty(&b.right)?);
            match b.op {
                And | Or => Ok(()),
                Eq | NotEq | Lt | LtEq | Gt | GtEq | IsDistinctFrom | IsNotDistinctFrom => {
                    if lt == rt || lt.is_null() || rt.is_null() {
                        Ok(())
                    } else {
                        Err(format!("a comparison between different types ({e}: {lt} and {rt})"))
                    }
                }
                Plus | Minus | Multiply | Divide | Modulo if lt.is_floating() && rt.is_floating() => Ok(()),
                StringConcat if is_text(&lt) && is_text(&rt) => Ok(()),
                LikeMatch | ILikeMatch | NotLikeMatch | NotILikeMatch => match string_literal(&b.right) {
                    Some(Some(p)) => check_like_pattern(p, matches!(b.op, ILikeMatch | NotILikeMatch)),
                    Some(None) => Ok(()),
                    None => Err(format!("`{e}`, a LIKE whose pattern is not a literal")),
                },
                op => Err(format!("the operator `{op}` on {lt} ({e}), which can fail on some values")),
            }
        }
        Expr::Between(b) => {
            all(&[&b.expr, &b.low, &b.high])?;
            let t = ty(&b.expr)?;
            if ty(&b.low)? == t && ty(&b.high)? == t {
                Ok(())
            } else {
                Err(format!("`{e}`, a BETWEEN with bounds of a different type"))
            }
        }
        Expr::InList(l) => {
            total(&l.expr, schema)?;
            let t = ty(&l.expr)?;
            for x in &l.list {
                if !matches!(x, Expr::Literal(..)) {
                    return Err(format!("`{x}` in an IN list (only literal values are accepted)"));
                }
                let xt = ty(x)?;
                if xt != t && !xt.is_null() {
                    return Err(format!("`{x}` in an IN list of {t} values (a value of type {xt})"));
                }
            }
            Ok(())
        }
        Expr::Like(l) => like_total(l, schema),
        Expr::SimilarTo(_) => Err(format!("`{e}` (SIMILAR TO compiles a regular expression)")),
        Expr::Cast(c) => {
            total(&c.expr, schema)?;
            let from = ty(&c.expr)?;
            if cast_is_total(&from, c.field.data_type()) {
                Ok(())
            } else {
                // A narrowing cast is total when the value's range fits (`plan::interval`).
                bounded(e, schema)
            }
        }
        Expr::TryCast(c) => total(&c.expr, schema),
        // Each branch is total where it runs: under what the earlier conditions say (`plan::interval`).
        Expr::Case(_) => bounded(e, schema),
        Expr::ScalarFunction(f) if listed_function(f) => f.args.iter().try_for_each(|a| total(a, schema)),
        // The numeric, text and date functions dpfusion bounds (`plan::interval`); any other is refused.
        Expr::ScalarFunction(_) => bounded(e, schema),
        Expr::AggregateFunction(a) => {
            let inner = a.func.inner();
            let p = &a.params;
            let known = inner.is::<Count>()
                || inner.is::<Sum>()
                || inner.is::<BoundedSum>()
                || inner.is::<Clipped>()
                || inner.is::<crate::plan::clip::KeptKey>()
                || inner.is::<crate::plan::quantile::SlotHistogram>()
                || inner.is::<crate::plan::quantile::KeepRows>()
                || per_person_aggregate(a, schema);
            if !known || p.distinct || p.filter.is_some() || !p.order_by.is_empty() {
                return Err(format!("the aggregate `{e}`"));
            }
            p.args.iter().try_for_each(|a| total(a, schema))
        }
        other => Err(format!("`{other}`")),
    }
}

/// Whether `a` is AVG, MIN or MAX of one number (of a question about each person, [`crate::plan::per_person`]):
/// over integers and floats these cannot fail (AVG divides by the count of a non-empty group, in floats).
fn per_person_aggregate(a: &datafusion::logical_expr::expr::AggregateFunction, schema: &DFSchema) -> bool {
    use datafusion::functions_aggregate::{average::Avg, min_max::Max, min_max::Min};
    let f = a.func.inner();
    let number = |e: &Expr| e.get_type(schema).is_ok_and(|t| t.is_integer() || t.is_floating());
    (f.is::<Avg>() || f.is::<Min>() || f.is::<Max>()) && matches!(a.params.args.as_slice(), [x] if number(x))
}

/// Whether `e` is total by the bounds of [`crate::plan::interval`], which proves the operations whose totality
/// depends on the values (it hands every other node back to [`total`]).
fn bounded(e: &Expr, schema: &DFSchema) -> std::result::Result<(), String> {
    crate::plan::interval::derive(e, schema).map(|_| ())
}

fn is_text(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null)
}

/// dpfusion's own scalar functions (the bounding's, all total on any value), and a struct field by a literal name
/// (the fields of `dp_clipped`; a computed name could fail).
pub(crate) fn listed_function(f: &datafusion::logical_expr::expr::ScalarFunction) -> bool {
    let inner = f.func.inner();
    let field_by_name =
        inner.is::<GetFieldFunc>() && matches!(f.args.as_slice(), [_, Expr::Literal(ScalarValue::Utf8(Some(_)), _)]);
    inner.is::<Priority>()
        || inner.is::<RandomFunc>()
        || inner.is::<CellIndex>()
        || inner.is::<CellKey>()
        || inner.is::<crate::plan::quantile::QuantileSlot>()
        || inner.is::<crate::plan::lookup::PublicLookup>()
        || inner.is::<crate::plan::selected::KeyPriority>()
        || field_by_name
}

fn like_total(l: &datafusion::logical_expr::Like, schema: &DFSchema) -> std::result::Result<(), String> {
    total(&l.expr, schema)?;
    let t = l.expr.get_type(schema).map_err(|e| e.to_string())?;
    if !matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null) {
        return Err(format!("LIKE on a value of type {t}"));
    }
    if l.escape_char.is_some_and(|c| c != '\\') {
        return Err("LIKE ... ESCAPE with an escape character other than '\\'".into());
    }
    match string_literal(&l.pattern) {
        Some(Some(p)) => check_like_pattern(p, l.case_insensitive),
        Some(None) => Ok(()),
        None => Err("a LIKE whose pattern is not a literal".into()),
    }
}

/// Checks every expression of every node of an optimized private plan with [`total`], and that the plan holds
/// only the node kinds a private plan is built from. This is the plan that runs: a refusal here means the
/// optimizer turned the query into something that could fail on some value.
pub fn check_total(plan: &LogicalPlan) -> Result<()> {
    let mut failure: Option<DpError> = None;
    plan.apply(|node| {
        let ok_node = matches!(
            node,
            LogicalPlan::TableScan(_)
                | LogicalPlan::Filter(_)
                | LogicalPlan::Projection(_)
                | LogicalPlan::Aggregate(_)
                | LogicalPlan::Unnest(_)
                | LogicalPlan::SubqueryAlias(_)
                | LogicalPlan::EmptyRelation(_)
        ) || matches!(node, LogicalPlan::Join(j) if matches!(j.join_type, JoinType::Inner | JoinType::Left)
            || matches!(j.join_type, JoinType::LeftSemi | JoinType::LeftAnti) && !j.null_aware)
            || matches!(node, LogicalPlan::Extension(e)
            if e.node.as_any().is::<UnitRuns>() || e.node.as_any().is::<ByUnit>())
            || matches!(node, LogicalPlan::Window(w)
            if w.window_expr.iter().all(|e| per_unit_rank(e, w.input.schema())));
        if !ok_node {
            failure = Some(DpError::Refused(Refusal::UnsafeNode { node: node.display().to_string() }));
            return Ok(TreeNodeRecursion::Stop);
        }
        // Expressions are typed against the node's input (a scan's filters against the scan itself, a join's
        // condition against both its inputs: a semi-join's output has only its left input's columns).
        let schema = match (node, node.inputs().first()) {
            (LogicalPlan::Join(j), _) => Arc::new(j.left.schema().join(j.right.schema())?),
            (_, Some(input)) => Arc::clone(input.schema()),
            (_, None) => Arc::clone(node.schema()),
        };
        node.apply_expressions(|e| {
            // A window node's expressions are its per-unit ranks, checked whole above.
            if matches!(node, LogicalPlan::Window(_)) {
                return Ok(TreeNodeRecursion::Continue);
            }
            if let Err(what) = total(e, &schema) {
                failure = Some(DpError::Refused(Refusal::UnsafePlan { what }));
                return Ok(TreeNodeRecursion::Stop);
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        Ok(if failure.is_some() { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
    })
    .map_err(engine)?;
    failure.map_or(Ok(()), Err)
}

/// Whether `e` is `LAG(__dp_unit, g) OVER (ORDER BY __dp_unit, …)` with a literal `g` and total ordering
/// expressions: whether a row has at least g rows of its own unit before it (the bounding of keys without a domain,
/// [`crate::plan::selected`]). Ordered by the unit first, the rows g places back are the unit's own or another
/// unit's, whatever the other units hold; ordered otherwise, or lagging another column, the answer would depend on
/// other units' rows, so that is refused.
fn per_unit_rank(e: &Expr, schema: &DFSchema) -> bool {
    use datafusion::logical_expr::expr::WindowFunctionDefinition;
    let is_unit = |x: &Expr| matches!(x, Expr::Column(c) if c.name == crate::plan::bound::UNIT);
    let e = match e {
        Expr::Alias(a) => a.expr.as_ref(),
        other => other,
    };
    let Expr::WindowFunction(w) = e else { return false };
    let p = &w.params;
    let lag = matches!(&w.fun, WindowFunctionDefinition::WindowUDF(f) if f.name() == "lag");
    let lags_unit = matches!(p.args.as_slice(), [u, Expr::Literal(ScalarValue::Int64(Some(g)), _), Expr::Literal(d, _)]
        if is_unit(u) && *g >= 1 && d.is_null());
    lag && lags_unit
        && p.partition_by.is_empty()
        && p.order_by.first().is_some_and(|s| is_unit(&s.expr))
        && p.filter.is_none()
        && !p.distinct
        && p.order_by.iter().all(|s| total(&s.expr, schema).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use DataType::*;

    #[test]
    fn widening_casts_are_total_and_narrowing_ones_are_not() {
        for (f, t) in [
            (Int32, Int64),
            (UInt32, Int64),
            (Int64, Float64),
            (Int64, Decimal128(20, 0)),
            (Float32, Float64),
            (Int64, Utf8),
            (Float64, Utf8View),
            (Boolean, Int8),
            (Null, Int8),
        ] {
            assert!(cast_is_total(&f, &t), "{f} -> {t}");
        }
        for (f, t) in [
            (Int64, Int32),
            (Int64, Int16),
            (UInt64, Int64),
            (Int8, UInt64),
            (Float64, Int64),
            (Float64, Decimal128(38, 0)),
            (Utf8, Int64),
            (Int64, Decimal128(10, 0)),
            (Decimal128(10, 2), Decimal128(10, 3)),
            (Utf8, Date32),
        ] {
            assert!(!cast_is_total(&f, &t), "{f} -> {t}");
        }
    }

    #[test]
    fn like_patterns_are_probed_before_they_run() {
        assert!(check_like_pattern("ab%", false).is_ok());
        assert!(check_like_pattern("%a_b%", true).is_ok());
        let long = check_like_pattern(&"_".repeat(MAX_LIKE_PATTERN + 1), false).unwrap_err();
        assert!(long.contains("at most"), "{long}");
    }

    #[test]
    fn flat_operator_chains_are_refused_before_parsing() {
        let chain = (0..=MAX_OPERATORS).map(|i| format!("age = {i}")).collect::<Vec<_>>().join(" OR ");
        let sql = format!("SELECT COUNT(*) FROM pums WHERE {chain}");
        assert!(check_statement_size(&sql).unwrap_err().to_string().contains("operators"));
        let items = (0..100_000).map(|i| i.to_string()).collect::<Vec<_>>().join(", ");
        assert!(check_statement_size(&format!("SELECT COUNT(*) FROM pums WHERE age IN ({items})")).is_ok());
    }

    #[test]
    fn nesting_counts_brackets_case_and_prefix_operators() {
        use datafusion::sql::sqlparser::dialect::GenericDialect;
        use datafusion::sql::sqlparser::tokenizer::Tokenizer;
        let depth = |sql: &str| nesting(&Tokenizer::new(&GenericDialect {}, sql).tokenize().unwrap());
        assert_eq!(depth("SELECT a - b FROM t WHERE x > 1"), 0);
        assert_eq!(depth("SELECT COUNT(*) FROM t WHERE ((a))"), 2);
        assert_eq!(depth("SELECT a FROM t WHERE NOT NOT NOT a"), 3);
        assert_eq!(depth("SELECT a FROM t WHERE NOT a AND NOT b AND NOT c"), 1);
        assert_eq!(depth("SELECT - - -a"), 3);
        assert_eq!(depth("SELECT -(-(-a))"), 5);
        assert_eq!(depth("SELECT CASE WHEN a THEN CASE WHEN b THEN 1 END END"), 2);
        assert_eq!(depth("SELECT f(g(h(x))), y"), 3);
        let deep = format!("SELECT COUNT(*) FROM t WHERE {}age{} > 1", "CAST(".repeat(48), " AS BIGINT)".repeat(48));
        let e = check_statement_size(&deep).unwrap_err();
        assert!(matches!(e, DpError::Refused(Refusal::TooDeep { depth: 48, .. })), "{e}");
        let ok = format!("SELECT COUNT(*) FROM t WHERE {}age{} > 1", "CAST(".repeat(32), " AS BIGINT)".repeat(32));
        assert!(check_statement_size(&ok).is_ok());
    }

    #[test]
    fn failing_constants_are_found_and_good_ones_pass() {
        use datafusion::logical_expr::lit;
        assert!(evaluate_constant(&Expr::Negative(Box::new(lit(i64::MIN)))).is_err());
        assert!(evaluate_constant(&(lit(1i64) / lit(0i64))).is_err());
        assert_eq!(evaluate_constant(&(lit(2i64) + lit(3i64))).unwrap(), ScalarValue::Int64(Some(5)));
    }
}
