//! Change notices between replicas, through PostgreSQL's LISTEN/NOTIFY.
//!
//! What [`Changes`] publishes here goes out on the `drover_changes`
//! channel, batched; what the other replicas publish comes in and is
//! published to this replica's own watchers (its event streams), and a
//! changed pool is woken for a pass (a pass of a pool this replica does not
//! drive ends at once). A notice is a hint, like the local ones: nothing
//! is lost when one is (the streams read the store, the worker resyncs),
//! only latency; after the listening connection was lost, every pool is
//! woken once.

use std::collections::HashSet;

use sqlx::postgres::PgListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::changes::{Changes, Subject};
use crate::db::Db;
use crate::runtime::Wake;

const CHANNEL: &str = "drover_changes";
/// Notices sent in one statement, at most.
const BATCH: usize = 512;

pub async fn run(
    me: std::sync::Arc<str>,
    db: Db,
    changes: Changes,
    mut outgoing: mpsc::UnboundedReceiver<Subject>,
    wakes: mpsc::UnboundedSender<Wake>,
    cancel: CancellationToken,
) {
    let Some(store) = db.shared_store().cloned() else { return };
    let mut listener = match PgListener::connect_with(&store).await {
        Ok(mut l) => match l.listen(CHANNEL).await {
            Ok(()) => Some(l),
            Err(e) => {
                tracing::warn!(error = %e, "listening for other replicas' changes failed; relying on resyncs");
                None
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "listening for other replicas' changes failed; relying on resyncs");
            None
        }
    };
    let mut batch = Vec::new();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            n = outgoing.recv_many(&mut batch, BATCH) => {
                if n == 0 {
                    return;
                }
                send(&store, &me, &mut batch).await;
            }
            heard = recv(&mut listener) => match heard {
                Ok(Some(payload)) => {
                    let Some((origin, subject)) = parse(&payload) else { continue };
                    if origin == &*me {
                        continue;
                    }
                    changes.heard(&subject);
                    if let Subject::Pool(pool) = subject {
                        let _ = wakes.send(Wake::Pool(pool));
                    }
                }
                // The connection was lost and is back: notices may have
                // been missed meanwhile.
                Ok(None) => {
                    let _ = wakes.send(Wake::All);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "listening for other replicas' changes: trying again");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
            },
        }
    }
}

/// The next payload; `Ok(None)` once after the connection came back.
async fn recv(listener: &mut Option<PgListener>) -> sqlx::Result<Option<String>> {
    let Some(l) = listener else { return std::future::pending().await };
    match l.try_recv().await? {
        Some(n) => Ok(Some(n.payload().to_owned())),
        None => Ok(None),
    }
}

async fn send(store: &sqlx::PgPool, me: &str, batch: &mut Vec<Subject>) {
    let unique: HashSet<Subject> = batch.drain(..).collect();
    let payloads: Vec<String> = unique.into_iter().map(|s| format(me, &s)).collect();
    let sent = sqlx::query("select pg_notify($1, p) from unnest($2::text[]) as p")
        .bind(CHANNEL)
        .bind(&payloads)
        .execute(store)
        .await;
    if let Err(e) = sent {
        tracing::debug!(error = %e, notices = payloads.len(), "telling other replicas of changes failed");
    }
}

fn format(me: &str, subject: &Subject) -> String {
    match subject {
        Subject::Pool(name) => format!("{me}\tpool\t{name}"),
        Subject::Job(id) => format!("{me}\tjob\t{id}"),
    }
}

fn parse(payload: &str) -> Option<(&str, Subject)> {
    let mut parts = payload.splitn(3, '\t');
    let (origin, kind, subject) = (parts.next()?, parts.next()?, parts.next()?);
    match kind {
        "pool" => Some((origin, Subject::Pool(subject.to_owned()))),
        "job" => Some((origin, Subject::Job(subject.parse().ok()?))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_name_their_origin_and_subject() {
        let pool = format("r1", &Subject::Pool("web".into()));
        assert_eq!(parse(&pool), Some(("r1", Subject::Pool("web".into()))));
        assert_eq!(parse(&format("r2", &Subject::Job(42))), Some(("r2", Subject::Job(42))));
        assert_eq!(parse("r1\tjob\tx"), None);
        assert_eq!(parse("garbage"), None);
    }
}
