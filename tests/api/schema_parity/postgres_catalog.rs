//! Reads a PostgreSQL schema (the connection's current schema) into the
//! neutral model, from `pg_catalog`: tables and columns (`pg_class`,
//! `pg_attribute`, `pg_attrdef`), constraints (`pg_constraint`: primary
//! keys, foreign keys, checks) and indexes (`pg_index`, unique constraints
//! included).

use std::collections::BTreeSet;

use sqlx::PgConnection;

use super::model::{Column, ForeignKey, Index, Schema, Table, Type};
use super::sql_text::{self, Token};

const TABLES: &str = "c.relnamespace = current_schema()::regnamespace and c.relkind in ('r', 'p') \
                      and c.relname <> '_sqlx_migrations'";

pub async fn read(c: &mut PgConnection) -> sqlx::Result<Schema> {
    let mut schema = Schema::default();
    read_columns(c, &mut schema).await?;
    read_constraints(c, &mut schema).await?;
    read_indexes(c, &mut schema).await?;
    Ok(schema.normalise())
}

/// The type a PostgreSQL column has in the neutral model: drover's
/// PostgreSQL migrations write counts and ids as `bigint` (`bigserial`)
/// where SQLite has its one 64-bit `integer`; times as `timestamptz`,
/// which SQLite keeps as RFC 3339 `text`; binary as `bytea` for `blob`.
/// JSON stays `text` on both (a `jsonb` column would be a drift).
fn neutral_type(pg: &str) -> Type {
    match pg {
        "bigint" | "integer" | "smallint" => Type::Integer,
        "boolean" => Type::Boolean,
        "text" | "timestamp with time zone" => Type::Text,
        "double precision" | "real" => Type::Real,
        "bytea" => Type::Blob,
        other => Type::Other(other.to_owned()),
    }
}

async fn read_columns(c: &mut PgConnection, schema: &mut Schema) -> sqlx::Result<()> {
    let sql = format!(
        "select c.relname::text, a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull, \
                pg_get_expr(d.adbin, d.adrelid), a.attidentity::text \
         from pg_class c join pg_attribute a on a.attrelid = c.oid \
         left join pg_attrdef d on d.adrelid = c.oid and d.adnum = a.attnum \
         where {TABLES} and a.attnum > 0 and not a.attisdropped order by c.relname, a.attnum"
    );
    let rows: Vec<(String, String, String, bool, Option<String>, String)> =
        sqlx::query_as(sqlx::AssertSqlSafe(sql)).fetch_all(&mut *c).await?;
    for (table, column, ty, not_null, default, identity) in rows {
        let ty = neutral_type(&ty);
        // `bigserial` is a sequence's `nextval(...)`; an identity column
        // is a sequence too. SQLite's `autoincrement` is read the same way.
        let default = match default {
            Some(d) if d.starts_with("nextval(") => Some("(a sequence)".into()),
            Some(d) => Some(sql_text::default(&d, ty == Type::Boolean)),
            None if !identity.is_empty() => Some("(a sequence)".into()),
            None => None,
        };
        let entry = schema.tables.entry(table).or_insert_with(|| Table { typed: true, ..Table::default() });
        entry.columns.insert(column, Column { ty, not_null, default });
    }
    Ok(())
}

/// `confdeltype` and `confupdtype`, in SQLite's words.
fn action(code: &str) -> String {
    match code {
        "a" => "no action",
        "r" => "restrict",
        "c" => "cascade",
        "n" => "set null",
        "d" => "set default",
        other => other,
    }
    .to_owned()
}

async fn read_constraints(c: &mut PgConnection, schema: &mut Schema) -> sqlx::Result<()> {
    let names = |keys: &str, table: &str| {
        format!(
            "array(select a.attname::text from unnest(k.{keys}) with ordinality u(n, o) \
             join pg_attribute a on a.attrelid = k.{table} and a.attnum = u.n order by u.o)"
        )
    };
    let sql = format!(
        "select c.relname::text, k.contype::text, pg_get_constraintdef(k.oid), {}, f.relname::text, {}, \
                k.confdeltype::text, k.confupdtype::text \
         from pg_constraint k join pg_class c on c.oid = k.conrelid left join pg_class f on f.oid = k.confrelid \
         where {TABLES} and k.contype in ('p', 'f', 'c') order by c.relname, k.conname",
        names("conkey", "conrelid"),
        names("confkey", "confrelid"),
    );
    type Row = (String, String, String, Vec<String>, Option<String>, Vec<String>, String, String);
    let rows: Vec<Row> = sqlx::query_as(sqlx::AssertSqlSafe(sql)).fetch_all(&mut *c).await?;
    for (table, kind, definition, columns, parent, parent_columns, on_delete, on_update) in rows {
        let Some(table) = schema.tables.get_mut(&table) else { continue };
        match kind.as_str() {
            "p" => table.primary_key = columns,
            "f" => {
                let fk = ForeignKey {
                    table: parent.unwrap_or_default(),
                    columns: parent_columns,
                    on_delete: action(&on_delete),
                    on_update: action(&on_update),
                };
                table.foreign_keys.insert(columns, fk);
            }
            _ => {
                let names: BTreeSet<String> = table.columns.keys().cloned().collect();
                for expr in sql_text::checks(&sql_text::tokens(&definition)) {
                    table.checks.insert(sql_text::summarise(expr, &names));
                }
            }
        }
    }
    Ok(())
}

async fn read_indexes(c: &mut PgConnection, schema: &mut Schema) -> sqlx::Result<()> {
    let sql = format!(
        "select c.relname::text, i.relname::text, x.indisunique, \
                exists(select 1 from pg_constraint k where k.conindid = x.indexrelid \
                       and k.conrelid = x.indrelid and k.contype = 'u'), \
                array(select pg_get_indexdef(x.indexrelid, n, true) \
                             || case when pg_index_column_has_property(x.indexrelid::regclass, n, 'desc') \
                                then ' desc' else '' end \
                      from generate_series(1, x.indnkeyatts) n order by n), \
                pg_get_expr(x.indpred, x.indrelid) \
         from pg_index x join pg_class c on c.oid = x.indrelid join pg_class i on i.oid = x.indexrelid \
         where {TABLES} and not x.indisprimary"
    );
    type Row = (String, String, bool, bool, Vec<String>, Option<String>);
    let rows: Vec<Row> = sqlx::query_as(sqlx::AssertSqlSafe(sql)).fetch_all(&mut *c).await?;
    for (table, index, unique, constraint, columns, predicate) in rows {
        let Some(table) = schema.tables.get_mut(&table) else { continue };
        let names: BTreeSet<String> = table.columns.keys().cloned().collect();
        let predicate = predicate.map(|p| sql_text::summarise(&sql_text::tokens(&p), &names));
        let name = (!constraint).then_some(index);
        table.add_index(columns.iter().map(|c| index_column(c)).collect(), Index { name, unique, predicate });
    }
    Ok(())
}

/// An index column as `pg_get_indexdef` shows it (`"position" desc`),
/// written as the SQLite reader writes it (`position desc`).
fn index_column(shown: &str) -> String {
    let (column, desc) = match shown.strip_suffix(" desc") {
        Some(column) => (column, " desc"),
        None => (shown, ""),
    };
    match sql_text::tokens(column).as_slice() {
        [Token::Word(w)] => format!("{w}{desc}"),
        _ => format!("(expression){desc}"),
    }
}
