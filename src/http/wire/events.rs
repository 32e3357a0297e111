//! A page of events, the same for pools, upgrade jobs and engines.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::db::page::Page;
use crate::domain::event::Event;

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EventList {
    /// Newest first.
    pub items: Vec<Event>,
    /// Pass as `cursor` to get the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

impl From<Page<Event>> for EventList {
    fn from(p: Page<Event>) -> Self {
        Self { items: p.items, next_cursor: p.next_cursor }
    }
}
