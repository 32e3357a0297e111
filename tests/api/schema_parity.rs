//! Schema parity (issue 29): the SQLite and the PostgreSQL migrations are
//! written by hand, in two folders, and must leave the same schema. Each
//! test migrates a fresh database of each kind as `drover::db::connect`
//! does, reads both catalogs into one neutral model (`model.rs`: tables,
//! columns with a type mapped between the stores, not-null, defaults,
//! primary keys, indexes and unique constraints, foreign keys, checks)
//! and compares them. Every difference fails the test in one message,
//! unless [`ALLOWED`] says why it is meant.

mod model;
mod postgres_catalog;
mod sql_text;
mod sqlite_catalog;

use std::time::Duration;

use drover::db::Location;
use sqlx::Connection;
use tempfile::TempDir;

use model::{Drift, Schema};

/// Differences that are meant, by their subject (as a failure prints it),
/// each with the reason. An entry that matches nothing fails the test too,
/// so that this list only ever holds what is still true.
const ALLOWED: &[(&str, &str)] = &[
    // One SQLite file has one drover process: it needs no leases, and
    // nothing of it is shared by replicas (docs/ha.md).
    ("table replicas", "PostgreSQL is the only store several replicas share"),
    ("table leases", "PostgreSQL is the only store several replicas share"),
];

const LIMIT: Duration = Duration::from_secs(120);

/// A fresh SQLite file migrated by drover, and a connection of the test's
/// own to it (the directory lives as long as the connection is used).
async fn migrated_sqlite() -> (TempDir, sqlx::SqliteConnection) {
    let dir = TempDir::new().expect("temporary directory");
    let path = dir.path().join("drover.db");
    drover::db::connect(&Location::Sqlite(path.clone())).await.expect("migrating a fresh SQLite file").close().await;
    let c = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display())).await.expect("opening it");
    (dir, c)
}

/// A fresh database on the test PostgreSQL server, migrated by drover.
async fn migrated_postgres() -> sqlx::PgConnection {
    let url = crate::postgres::shared().fresh_database();
    let location = Location::parse(&url).expect("a database URL");
    drover::db::connect(&location).await.expect("migrating a fresh PostgreSQL database").close().await;
    sqlx::PgConnection::connect(&url).await.expect("connecting to it")
}

async fn read(sqlite: &mut sqlx::SqliteConnection, postgres: &mut sqlx::PgConnection) -> (Schema, Schema) {
    let a = sqlite_catalog::read(sqlite).await.expect("reading SQLite's catalog");
    let b = postgres_catalog::read(postgres).await.expect("reading PostgreSQL's catalog");
    (a, b)
}

fn listed(drifts: &[&Drift]) -> String {
    drifts.iter().map(|d| format!("  {d}\n")).collect()
}

#[tokio::test]
async fn sqlite_and_postgres_migrations_leave_the_same_schema() {
    let (sqlite, postgres) = tokio::time::timeout(LIMIT, async {
        let (_dir, mut sqlite) = migrated_sqlite().await;
        let mut postgres = migrated_postgres().await;
        read(&mut sqlite, &mut postgres).await
    })
    .await
    .expect("migrating and reading both stores took over 2 minutes: a catalog query or the test server hangs");
    // A reader that finds none of one kind of thing would compare nothing
    // of that kind and pass: each must have found some on both stores.
    for (store, schema) in [("SQLite", &sqlite), ("PostgreSQL", &postgres)] {
        let found = schema.found();
        assert!(found.iter().all(|(_, n)| *n > 0), "{store}'s catalog read as {found:?}: a reader is broken");
    }
    let drifts = model::compare(&sqlite, &postgres);
    let reason = |d: &Drift| ALLOWED.iter().find(|(subject, _)| *subject == d.subject);
    let unexpected: Vec<&Drift> = drifts.iter().filter(|d| reason(d).is_none()).collect();
    let stale: Vec<&str> =
        ALLOWED.iter().map(|(s, _)| *s).filter(|s| !drifts.iter().any(|d| d.subject == *s)).collect();
    assert!(
        unexpected.is_empty() && stale.is_empty(),
        "the migrations of migrations/sqlite and migrations/postgres leave different schemas.\n\
         Fix each with a new migration, or allow it in ALLOWED with the reason:\n{}\
         Allowed differences no longer found (remove them from ALLOWED): {stale:?}",
        listed(&unexpected),
    );
}

#[tokio::test]
async fn a_column_changed_on_one_store_only_is_reported() {
    tokio::time::timeout(LIMIT, async {
        let (_dir, mut sqlite) = migrated_sqlite().await;
        let mut postgres = migrated_postgres().await;
        let changes = [
            "alter table pools add column parity_probe text",
            "alter table pools add column parity_flag integer not null default 0 check (parity_flag in (0, 1)) ",
        ];
        for sql in changes {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&mut sqlite).await.expect(sql);
        }
        let changes = [
            "alter table pools add column parity_flag bigint not null default 0",
            "alter table engines alter column labels set default '[]'",
            "alter table machines alter column image drop not null",
            "alter table tokens alter column last_used_at type timestamp",
            "alter table clusters add constraint parity_probe check (server <> '')",
            "drop index events_by_time",
        ];
        for sql in changes {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&mut postgres).await.expect(sql);
        }
        let (a, b) = read(&mut sqlite, &mut postgres).await;
        let drifts = model::compare(&a, &b);
        let expected = [
            "pools.parity_probe",
            "pools.parity_flag type",
            "engines.labels default",
            "machines.image not null",
            "tokens.last_used_at type",
            "clusters.server check <> ['']",
            "events index on (time)",
        ];
        let all: Vec<&Drift> = drifts.iter().collect();
        for subject in expected {
            assert!(drifts.iter().any(|d| d.subject == subject), "{subject} is not reported; all:\n{}", listed(&all));
        }
    })
    .await
    .expect("migrating and reading both stores took over 2 minutes: a catalog query or the test server hangs");
}

#[test]
fn schemas_read_as_empty_are_a_difference() {
    let drifts = model::compare(&Schema::default(), &Schema::default());
    assert!(drifts.iter().any(|d| d.subject == "schema"), "{drifts:?}");
}

#[test]
fn each_stores_spelling_of_one_rule_reads_alike_and_different_rules_do_not() {
    use sql_text::{checks, default, summarise, tokens};
    let columns = ["kind", "step", "spec"].map(String::from).into();
    let read = |sqlite: &str, postgres: &str| {
        let postgres = tokens(postgres);
        (summarise(&tokens(sqlite), &columns), summarise(checks(&postgres)[0], &columns))
    };
    let alike = [
        ("kind in ('pool', 'job')", "CHECK ((kind = ANY (ARRAY['pool'::text, 'job'::text])))"),
        ("step between 0 and 7", "CHECK (((step >= 0) AND (step <= 7)))"),
        ("json_valid(spec)", "CHECK (((spec)::jsonb IS NOT NULL))"),
        ("spec is null or json_valid(spec)", "CHECK (((spec IS NULL) OR ((spec)::jsonb IS NOT NULL)))"),
        ("kind != ''", "CHECK ((kind <> ''::text))"),
    ];
    for (sqlite, postgres) in alike {
        let (a, b) = read(sqlite, postgres);
        assert_eq!(a, b, "{sqlite} and {postgres} read differently");
    }
    let different = [
        ("step >= 1", "CHECK ((step > 1))"),
        ("kind in ('pool')", "CHECK ((kind = ANY (ARRAY['pool'::text, 'job'::text])))"),
        ("spec is null or json_valid(spec)", "CHECK (((spec)::jsonb IS NOT NULL))"),
        ("kind in ('pool')", "CHECK ((kind <> ALL (ARRAY['pool'::text])))"),
    ];
    for (sqlite, postgres) in different {
        let (a, b) = read(sqlite, postgres);
        assert_ne!(a, b, "{sqlite} and {postgres} read alike");
    }
    assert_eq!(default("'{}'", false), default("'{}'::text", false));
    assert_eq!(default("0", true), default("false", true));
    assert_eq!(default("-1", false), default("'-1'::integer", false));
    assert_ne!(default("'local'", false), default("'remote'::text", false));
}
