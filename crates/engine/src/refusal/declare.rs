//! The macros that turn the declaration of the refusals (`refusals! { ... }` in `refusal.rs`) into the `Refusal`
//! enum, its message (`Display`, by thiserror), [`Refusal::hint`](super::Refusal::hint),
//! [`Refusal::code`](super::Refusal::code), [`Refusal::sqlstate`](super::Refusal::sqlstate) and
//! [`Refusal::catalogue`](super::Refusal::catalogue), in the manner of axum's `__define_rejection!`: each fact of a
//! refusal is written once, beside the others, and cannot drift from them.

use std::fmt;

/// `{name}`: what a field's value is shown as in the catalogue, where there is no value.
pub(super) struct Placeholder(pub(super) &'static str);

impl fmt::Display for Placeholder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{{}}}", self.0)
    }
}

/// The words of a list as prose: `a`, `a and b`, `a, b and c` (string literals in, one literal out, for `concat!`).
macro_rules! and_list {
    ($last:expr) => { $last };
    ($first:expr, $last:expr) => { concat!($first, " and ", $last) };
    ($first:expr, $($rest:expr),+) => { concat!($first, ", ", and_list!($($rest),+)) };
}

/// Declares the refusals, by group. Each refusal is
///
/// ```text
/// /// What it means (the variant's documentation, and the catalogue's).
/// #[code = "stable_code", sqlstate = SQLSTATE_CONSTANT_OF_SqlState]
/// #[error("the message, with {field} and named arguments, as thiserror takes it", ...)]
/// #[hint_if(condition on the fields, "when it applies", "another hint, given instead")]   (any number)
/// #[hint("what to change, with {field}, {CONSTANT} or {name}", name = expression of the fields, ...)]
/// Variant { /// doc
///           field: Type, ... }    (or a unit variant)
/// ```
///
/// A hint names fields (`{column}`) and the module's constants (`{SETTABLE}`) directly, and anything computed from
/// the fields by a named argument. The catalogue shows every field and named argument as `{name}`, and every
/// constant as its value.
macro_rules! refusals {
    (
        $(
            $group:literal {
                $(
                    $(#[doc = $doc:literal])*
                    #[code = $code:literal, sqlstate = $state:ident]
                    #[error($message:literal $($message_args:tt)*)]
                    $(#[hint_if($condition:expr, $when:literal, $other_hint:literal)])*
                    #[hint($hint:literal $(, $arg:ident = $value:expr)* $(,)?)]
                    $variant:ident $({ $( $(#[doc = $field_doc:literal])* $field:ident : $type:ty ),* $(,)? })?
                ),* $(,)?
            }
        ),* $(,)?
    ) => {
        /// The cause of a refusal.
        #[derive(Clone, Debug, PartialEq, Error)]
        #[non_exhaustive]
        pub enum Refusal {
            $($(
                $(#[doc = $doc])*
                #[error($message $($message_args)*)]
                $variant $({ $( $(#[doc = $field_doc])* $field: $type ),* })?,
            )*)*
        }

        impl Refusal {
            /// What to change so that the statement is answered.
            #[allow(unused_variables, clippy::useless_format)]
            pub fn hint(&self) -> String {
                match self {
                    $($(
                        Self::$variant $({ $($field),* })? => {
                            $(if $condition {
                                return format!($other_hint);
                            })*
                            format!($hint $(, $arg = $value)*)
                        }
                    )*)*
                }
            }

            /// A stable identifier of the cause, for programs (the JSON output's `code`; a server's SQLSTATE is
            /// [`Refusal::sqlstate`]). Codes never change: clients match them.
            pub fn code(&self) -> &'static str {
                match self {
                    $($(Self::$variant { .. } => $code,)*)*
                }
            }

            /// The SQLSTATE a PostgreSQL client receives for this refusal.
            pub fn sqlstate(&self) -> SqlState {
                match self {
                    $($(Self::$variant { .. } => SqlState::$state,)*)*
                }
            }

            /// Every refusal, in the order of the declaration, as the documentation shows it (`docs/refusals.md`
            /// is made from it): its code, SQLSTATE, meaning, message and hints, with `{name}` where a value goes.
            #[allow(unused_variables, clippy::useless_format)]
            pub fn catalogue() -> Vec<Entry> {
                vec![$($({
                    $($(let $field = Placeholder(stringify!($field));)*)?
                    Entry {
                        group: $group,
                        variant: stringify!($variant),
                        code: $code,
                        sqlstate: SqlState::$state,
                        meaning: [$($doc),*].map(str::trim).join(" "),
                        fields: vec![$($(stringify!($field)),*)?],
                        message: $message,
                        hint: format!($hint $(, $arg = Placeholder(stringify!($arg)))*),
                        other_hints: vec![$(($when, format!($other_hint))),*],
                    }
                },)*)*]
            }
        }
    };
}

/// Reads the `SET dp.*` options' declaration (`dp_options_table!`, beside `DpOptions`) for what refusals quote:
/// [`SETTABLE`](super::SETTABLE), and each option's hint for a value it does not accept. The session expands the
/// same declaration into the options themselves; this expansion keeps only text, so that `refusal` does not
/// depend on the session.
macro_rules! option_hints {
    (
        $(
            $(#[doc = $doc:literal])*
            $name:ident: $type:ty { example: $example:literal, default: $default:literal, hint: $hint:expr, $($rest:tt)* }
        ),* $(,)?
    ) => {
        /// The options `SET dp.<name>` accepts, as hints list them.
        pub const SETTABLE: &str = and_list!($(concat!("dp.", stringify!($name))),*);

        /// What `SET dp.<option>` accepts, as the hint of a value it refuses says.
        fn accepted(option: &str) -> String {
            match option {
                $(stringify!($name) => $hint.to_string(),)*
                _ => format!("the options are {SETTABLE}"),
            }
        }
    };
}
