//! Reads a SQLite schema into the neutral model: `sqlite_master` and the
//! `pragma_*` table functions, and the checks out of each table's stored
//! `create table` text (SQLite keeps no catalog of them).

use std::collections::BTreeSet;

use sqlx::SqliteConnection;

use super::model::{Column, ForeignKey, Index, Schema, Table, Type};
use super::sql_text::{self, Token};

pub async fn read(c: &mut SqliteConnection) -> sqlx::Result<Schema> {
    // `sqlite_*` are SQLite's own (`sqlite_sequence` backs autoincrement);
    // `_sqlx_migrations` is sqlx's record of what ran, not drover's schema.
    let tables: Vec<(String, String)> = sqlx::query_as(
        "select name, sql from sqlite_master where type = 'table' \
         and name not like 'sqlite\\_%' escape '\\' and name <> '_sqlx_migrations' order by name",
    )
    .fetch_all(&mut *c)
    .await?;
    let mut schema = Schema::default();
    for (name, sql) in tables {
        let table = read_table(c, &name, &sql).await?;
        schema.tables.insert(name, table);
    }
    Ok(schema.normalise())
}

async fn read_table(c: &mut SqliteConnection, name: &str, sql: &str) -> sqlx::Result<Table> {
    let strict: i64 = sqlx::query_scalar("select strict from pragma_table_list where schema = 'main' and name = $1")
        .bind(name)
        .fetch_one(&mut *c)
        .await?;
    let mut table = Table { typed: strict == 1, ..Table::default() };
    let statement = sql_text::tokens(sql);
    let declared: Vec<(String, String, bool, Option<String>, i64)> =
        sqlx::query_as("select name, type, \"notnull\", dflt_value, pk from pragma_table_info($1) order by cid")
            .bind(name)
            .fetch_all(&mut *c)
            .await?;
    let names: BTreeSet<String> = declared.iter().map(|d| d.0.clone()).collect();
    let booleans: BTreeSet<&str> =
        sql_text::checks(&statement).into_iter().filter_map(sql_text::boolean_check).collect();
    let mut key: Vec<(i64, String)> = declared.iter().filter(|d| d.4 > 0).map(|d| (d.4, d.0.clone())).collect();
    key.sort();
    table.primary_key = key.into_iter().map(|(_, c)| c).collect();
    for (column, ty, not_null, default, pk) in &declared {
        // Only `integer` (not `int`) makes a one-column primary key the rowid.
        let integer = ty.eq_ignore_ascii_case("integer");
        let rowid = integer && *pk > 0 && table.primary_key.len() == 1;
        let boolean = integer && booleans.contains(column.as_str());
        let ty = match ty.to_lowercase().as_str() {
            _ if boolean => Type::Boolean,
            "integer" | "int" => Type::Integer,
            "text" => Type::Text,
            "real" => Type::Real,
            "blob" => Type::Blob,
            other => Type::Other(other.to_owned()),
        };
        let default = match default {
            Some(d) => Some(sql_text::default(d, boolean)),
            // An `integer primary key` is the rowid: numbered like a
            // sequence with `autoincrement`, and otherwise reusing the
            // highest number once its row is deleted.
            None if rowid && has_word(&statement, "autoincrement") => Some("(a sequence)".into()),
            None if rowid => Some("(rowid, reused after a delete)".into()),
            None => None,
        };
        // A STRICT table's primary key is not null whatever it says; a
        // rowid never is.
        let not_null = *not_null || (*pk > 0 && (strict == 1 || rowid));
        table.columns.insert(column.clone(), Column { ty, not_null, default });
    }
    for expr in sql_text::checks(&statement) {
        if sql_text::boolean_check(expr).is_none() {
            table.checks.insert(sql_text::summarise(expr, &names));
        }
    }
    read_indexes(c, name, &names, &mut table).await?;
    read_foreign_keys(c, name, &mut table).await?;
    Ok(table)
}

fn has_word(statement: &[Token], word: &str) -> bool {
    statement.iter().any(|t| *t == Token::Word(word.into()))
}

async fn read_indexes(
    c: &mut SqliteConnection,
    name: &str,
    names: &BTreeSet<String>,
    table: &mut Table,
) -> sqlx::Result<()> {
    let list: Vec<(String, bool, String, bool)> =
        sqlx::query_as("select name, \"unique\", origin, partial from pragma_index_list($1) where origin <> 'pk'")
            .bind(name)
            .fetch_all(&mut *c)
            .await?;
    for (index, unique, origin, partial) in list {
        let columns: Vec<(Option<String>, bool)> =
            sqlx::query_as("select name, \"desc\" from pragma_index_xinfo($1) where key = 1 order by seqno")
                .bind(&index)
                .fetch_all(&mut *c)
                .await?;
        let columns = columns
            .into_iter()
            .map(|(col, desc)| {
                format!("{}{}", col.unwrap_or_else(|| "(expression)".into()), if desc { " desc" } else { "" })
            })
            .collect();
        let predicate = if partial {
            let sql: String = sqlx::query_scalar("select sql from sqlite_master where type = 'index' and name = $1")
                .bind(&index)
                .fetch_one(&mut *c)
                .await?;
            let tokens = sql_text::tokens(&sql);
            let at = tokens.iter().position(|t| *t == Token::Word("where".into())).unwrap_or(tokens.len());
            Some(sql_text::summarise(&tokens[at..], names))
        } else {
            None
        };
        // `origin` is `c` for `create index`, `u` for a unique constraint.
        let name = (origin == "c").then_some(index);
        table.add_index(columns, Index { name, unique, predicate });
    }
    Ok(())
}

async fn read_foreign_keys(c: &mut SqliteConnection, name: &str, table: &mut Table) -> sqlx::Result<()> {
    let rows: Vec<(i64, String, String, Option<String>, String, String)> = sqlx::query_as(
        "select id, \"table\", \"from\", \"to\", on_update, on_delete from pragma_foreign_key_list($1) order by id, seq",
    )
    .bind(name)
    .fetch_all(&mut *c)
    .await?;
    // Per key: its columns, the parent's columns as named, the rest.
    type Partial = (Vec<String>, Vec<Option<String>>, ForeignKey);
    let mut by_id: std::collections::BTreeMap<i64, Partial> = Default::default();
    for (id, parent, from, to, on_update, on_delete) in rows {
        let entry = by_id.entry(id).or_insert_with(|| {
            let fk = ForeignKey {
                table: parent,
                columns: vec![],
                on_delete: on_delete.to_lowercase(),
                on_update: on_update.to_lowercase(),
            };
            (vec![], vec![], fk)
        });
        entry.0.push(from);
        entry.1.push(to);
    }
    for (columns, to, mut fk) in by_id.into_values() {
        // A reference that names no column is to the parent's primary key.
        fk.columns = match to.into_iter().collect::<Option<Vec<String>>>() {
            Some(to) => to,
            None => {
                sqlx::query_scalar("select name from pragma_table_info($1) where pk > 0 order by pk")
                    .bind(&fk.table)
                    .fetch_all(&mut *c)
                    .await?
            }
        };
        table.foreign_keys.insert(columns, fk);
    }
    Ok(())
}
