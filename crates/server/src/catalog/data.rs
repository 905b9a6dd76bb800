//! The catalog's contents as data: the relations and their columns (`data/relations.txt`), their fixed rows
//! (`data/rows.txt`), the base types of `pg_type` (`data/pg_type.txt`) and the DataFusion functions a catalog query
//! may call (`data/catalog_functions.txt`), read once from files compiled in.
//! A line that does not read is an error of [`Catalog::new`](super::Catalog::new) (and of this module's test).

use super::{Ct, NS_INFORMATION_SCHEMA, NS_PG_CATALOG, V};
use datafusion::common::DataFusionError;
use datafusion::error::Result;
use std::sync::LazyLock;

const RELATIONS: &str = include_str!("../../data/relations.txt");
const ROWS: &str = include_str!("../../data/rows.txt");
const PG_TYPES: &str = include_str!("../../data/pg_type.txt");
const FUNCTIONS: &str = include_str!("../../data/catalog_functions.txt");

/// One relation of `data/relations.txt`.
#[derive(Debug)]
pub(super) struct RelationDef {
    pub(super) name: &'static str,
    pub(super) oid: i32,
    pub(super) namespace: i32,
    pub(super) kind: &'static str,
    pub(super) cols: Vec<(&'static str, Ct)>,
}

/// One base type of `data/pg_type.txt` (its array type is `_name`, oid `array`).
#[derive(Debug)]
pub(super) struct PgType {
    pub(super) oid: i32,
    pub(super) name: &'static str,
    pub(super) len: i16,
    pub(super) byval: bool,
    pub(super) category: &'static str,
    pub(super) align: &'static str,
    pub(super) storage: &'static str,
    pub(super) collation: i32,
    pub(super) array: i32,
    /// What `format_type` calls it.
    pub(super) format: &'static str,
}

fn bad(file: &str, line: &str, what: &str) -> DataFusionError {
    DataFusionError::Internal(format!("crates/server/data/{file}: {what} in line `{line}`"))
}

/// The lines of a data file that are not comments or blank.
fn lines(text: &'static str) -> impl Iterator<Item = &'static str> {
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#'))
}

fn number<T: std::str::FromStr>(file: &str, line: &str, text: &str) -> Result<T> {
    text.trim().parse().map_err(|_| bad(file, line, &format!("`{text}` is not a number")))
}

fn column_type(file: &str, line: &str, name: &str) -> Result<Ct> {
    Ok(match name {
        "int2" => Ct::I2,
        "int4" => Ct::I4,
        "int8" => Ct::I8,
        "float4" => Ct::F4,
        "text" => Ct::T,
        "bool" => Ct::B,
        "text[]" => Ct::LT,
        "int4[]" => Ct::LI,
        other => return Err(bad(file, line, &format!("unknown column type `{other}`"))),
    })
}

fn relation(line: &'static str) -> Result<RelationDef> {
    let f = "relations.txt";
    let (head, cols) = line.split_once('|').ok_or_else(|| bad(f, line, "no `|`"))?;
    let [name, oid, schema, kind] = head.split_whitespace().collect::<Vec<_>>()[..] else {
        return Err(bad(f, line, "expected `name oid schema relkind |`"));
    };
    let namespace = match schema {
        "pg_catalog" => NS_PG_CATALOG,
        "information_schema" => NS_INFORMATION_SCHEMA,
        other => return Err(bad(f, line, &format!("unknown schema `{other}`"))),
    };
    let cols = cols
        .split(',')
        .map(|c| match c.split_whitespace().collect::<Vec<_>>()[..] {
            [name, t] => Ok((name, column_type(f, line, t)?)),
            _ => Err(bad(f, line, &format!("expected `column type`, not `{c}`"))),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RelationDef { name, oid: number(f, line, oid)?, namespace, kind, cols })
}

fn pg_type(line: &'static str) -> Result<PgType> {
    let f = "pg_type.txt";
    let cells: Vec<&'static str> = line.split('|').map(str::trim).collect();
    let [oid, name, len, byval, category, align, storage, collation, array, format] = cells[..] else {
        return Err(bad(f, line, "expected 10 cells"));
    };
    Ok(PgType {
        oid: number(f, line, oid)?,
        name,
        len: number(f, line, len)?,
        byval: byval == "t",
        category,
        align,
        storage,
        collation: number(f, line, collation)?,
        array: number(f, line, array)?,
        format,
    })
}

static RELATION_DEFS: LazyLock<std::result::Result<Vec<RelationDef>, String>> =
    LazyLock::new(|| lines(RELATIONS).map(relation).collect::<Result<_>>().map_err(|e| e.to_string()));
static PG_TYPE_ROWS: LazyLock<std::result::Result<Vec<PgType>, String>> =
    LazyLock::new(|| lines(PG_TYPES).map(pg_type).collect::<Result<_>>().map_err(|e| e.to_string()));

/// The relations of `data/relations.txt`, in order.
pub(super) fn relations() -> Result<&'static [RelationDef]> {
    RELATION_DEFS.as_deref().map_err(|e| DataFusionError::Internal(e.clone()))
}

/// The base types of `data/pg_type.txt` (none if the file does not read: [`relations`]' caller checks [`check`]).
pub(super) fn types() -> &'static [PgType] {
    PG_TYPE_ROWS.as_deref().unwrap_or(&[])
}

/// The DataFusion functions a catalog query may call (`data/catalog_functions.txt`: the first word of each line,
/// lower case).
pub(super) fn allowed_functions() -> impl Iterator<Item = &'static str> {
    lines(FUNCTIONS).filter_map(|l| l.split_whitespace().next())
}

/// Whether every data file reads.
pub(super) fn check() -> Result<()> {
    relations()?;
    if let Some(name) = allowed_functions().find(|n| n.chars().any(|c| !c.is_ascii_lowercase() && c != '_')) {
        return Err(bad("catalog_functions.txt", name, "a function name is lower-case letters and `_`"));
    }
    PG_TYPE_ROWS.as_ref().map_err(|e| DataFusionError::Internal(e.clone()))?;
    fixed_rows("", "", "").map(|_| ())
}

/// The fixed rows of `relation` (`data/rows.txt`), typed by its columns, with `$user` and `$database` filled in.
pub(super) fn fixed_rows(relation: &str, user: &str, database: &str) -> Result<Vec<Vec<V>>> {
    let f = "rows.txt";
    let defs = relations()?;
    let mut out = Vec::new();
    for line in lines(ROWS) {
        let mut cells = line.split('|').map(str::trim);
        let name = cells.next().unwrap_or_default();
        let def = defs.iter().find(|d| d.name == name).ok_or_else(|| bad(f, line, "unknown relation"))?;
        let cells: Vec<&str> = cells.collect();
        if cells.len() != def.cols.len() {
            return Err(bad(f, line, &format!("{} cells for {} columns", cells.len(), def.cols.len())));
        }
        let row = cells
            .iter()
            .zip(&def.cols)
            .map(|(cell, (_, ct))| match (*cell, ct) {
                ("\\N", _) => Ok(V::N),
                ("$user", Ct::T) => Ok(V::S(user.to_string())),
                ("$database", Ct::T) => Ok(V::S(database.to_string())),
                (text, Ct::T) => Ok(V::S(text.to_string())),
                (text, Ct::B) => Ok(V::B(text == "t")),
                (text, Ct::I2 | Ct::I4 | Ct::I8) => Ok(V::I(number(f, line, text)?)),
                (text, Ct::F4) => Ok(V::F(number(f, line, text)?)),
                (text, Ct::LT | Ct::LI) => Err(bad(f, line, &format!("array `{text}` (only \\N)"))),
            })
            .collect::<Result<Vec<_>>>()?;
        if name == relation {
            out.push(row);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_data_file_reads() {
        if let Err(e) = check() {
            panic!("{e}");
        }
        assert!(relations().is_ok_and(|r| r.len() >= 40));
        assert!(types().iter().any(|t| t.name == "date" && t.oid == 1082 && t.array == 1182));
        assert!(fixed_rows("pg_roles", "alice", "db").is_ok_and(|r| matches!(&r[0][1], V::S(u) if u == "alice")));
    }
}
