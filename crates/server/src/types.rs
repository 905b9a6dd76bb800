//! The one map from Arrow types to PostgreSQL types, for the catalog (`pg_attribute.atttypid`, `format_type`,
//! `information_schema.columns`) and the wire (RowDescription, DataRow) alike: a `date` column is `date` in `\d`
//! and in its results. The wire encoding itself is the `arrow-pg` crate's; this module only chooses, for the few
//! Arrow types arrow-pg does not send, the Arrow type a column is cast to first ([`sendable`]).

use datafusion::arrow::datatypes::{DataType, Field};
use pgwire::api::Type;
use std::sync::Arc;

/// Largest decimal precision sent as `numeric` (arrow-pg encodes decimals with rust_decimal's 28 digits); wider
/// decimals go out as `double precision`.
const MAX_NUMERIC_PRECISION: u8 = 28;

/// The Arrow type a column of type `dt` is sent as: `dt` itself when arrow-pg encodes it, else the nearest type it
/// does (small integers widened, decimals as 128-bit, NULL and the nested types it cannot send as text).
pub(crate) fn sendable(dt: &DataType) -> DataType {
    match dt {
        DataType::Null => DataType::Utf8,
        DataType::Int8 => DataType::Int16,
        DataType::Float16 => DataType::Float32,
        DataType::Decimal32(p, s) | DataType::Decimal64(p, s) | DataType::Decimal128(p, s)
            if *p <= MAX_NUMERIC_PRECISION && *s >= 0 =>
        {
            DataType::Decimal128(*p, *s)
        }
        DataType::Decimal32(..) | DataType::Decimal64(..) | DataType::Decimal128(..) | DataType::Decimal256(..) => {
            DataType::Float64
        }
        DataType::Dictionary(_, value) => sendable(value),
        DataType::List(f) | DataType::LargeList(f) => match list_element(f.data_type()) {
            Some(element) => DataType::List(Arc::new(Field::new("item", element, true))),
            None => DataType::Utf8,
        },
        DataType::Boolean
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64
        | DataType::Float32
        | DataType::Float64
        | DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Utf8View
        | DataType::Binary
        | DataType::LargeBinary
        | DataType::Date32
        | DataType::Date64
        | DataType::Time32(_)
        | DataType::Time64(_)
        | DataType::Timestamp(..) => dt.clone(),
        _ => DataType::Utf8,
    }
}

/// The element type a list of `dt` is sent with, if arrow-pg sends such a list as a PostgreSQL array.
fn list_element(dt: &DataType) -> Option<DataType> {
    match sendable(dt) {
        t @ (DataType::Boolean
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::Float32
        | DataType::Float64
        | DataType::Utf8
        | DataType::Date32
        | DataType::Timestamp(..)) => Some(t),
        _ => None,
    }
}

/// The PostgreSQL type of a column of Arrow type `dt`, on the wire and in the catalog.
pub(crate) fn pg_type(dt: &DataType) -> Type {
    arrow_pg::datatypes::into_pg_type(&sendable(dt)).unwrap_or(Type::TEXT)
}

/// The PostgreSQL type oid and typmod of a column of Arrow type `dt` (typmod: `numeric(p,s)` only, else -1).
pub(crate) fn pg_oid_typmod(dt: &DataType) -> (i32, i32) {
    let oid = i32::try_from(pg_type(dt).oid()).unwrap_or(25);
    let typmod = match sendable(dt) {
        DataType::Decimal128(p, s) if s >= 0 && i32::from(s) <= i32::from(p) => {
            ((i32::from(p) << 16) | i32::from(s)) + 4
        }
        _ => -1,
    };
    (oid, typmod)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::TimeUnit;

    #[test]
    fn one_type_for_each_column_type_the_engine_reads() {
        let cases = [
            (DataType::Int8, Type::INT2),
            (DataType::Int16, Type::INT2),
            (DataType::Int32, Type::INT4),
            (DataType::Int64, Type::INT8),
            (DataType::Float32, Type::FLOAT4),
            (DataType::Float64, Type::FLOAT8),
            (DataType::Utf8, Type::TEXT),
            (DataType::Boolean, Type::BOOL),
            (DataType::Date32, Type::DATE),
            (DataType::Timestamp(TimeUnit::Microsecond, None), Type::TIMESTAMP),
            (DataType::Decimal128(10, 2), Type::NUMERIC),
            (DataType::Decimal256(60, 2), Type::FLOAT8),
            (DataType::Null, Type::TEXT),
        ];
        for (dt, t) in cases {
            assert_eq!(pg_type(&dt), t, "{dt}");
        }
        assert_eq!(pg_oid_typmod(&DataType::Decimal128(10, 2)), (1700, (10 << 16 | 2) + 4));
        assert_eq!(pg_oid_typmod(&DataType::Date32), (1082, -1));
    }
}
