//! Page parameters shared by every list endpoint.

use serde::Deserialize;
use utoipa::IntoParams;

use crate::db::cursor;
use crate::error::ApiError;

pub const DEFAULT_LIMIT: u32 = 50;
pub const MAX_LIMIT: u32 = 500;

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Items per page, 1 to 500 (default 50).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
    /// Opaque cursor: the `next_cursor` of the previous page, unchanged
    /// (URL-safe base64 without padding).
    #[param(pattern = "^[A-Za-z0-9_-]*$")]
    pub cursor: Option<String>,
}

impl PageParams {
    pub fn limit(&self) -> Result<u32, ApiError> {
        match self.limit {
            None => Ok(DEFAULT_LIMIT),
            Some(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
            Some(n) => Err(ApiError::invalid("limit", "range", format!("must be between 1 and {MAX_LIMIT} (got {n})"))),
        }
    }

    /// The key the cursor carries, if any.
    pub fn after(&self) -> Result<Option<String>, ApiError> {
        self.cursor.as_deref().map(|c| cursor::decode(c).ok_or_else(bad_cursor)).transpose()
    }

    /// The numeric key the cursor carries, for id-ordered lists.
    pub fn after_id(&self) -> Result<Option<i64>, ApiError> {
        self.after()?.map(|k| k.parse().map_err(|_| bad_cursor())).transpose()
    }
}

fn bad_cursor() -> ApiError {
    ApiError::invalid(
        "cursor",
        "cursor",
        "is not a cursor this server issued; pass next_cursor from the previous page unchanged",
    )
}

/// `next_cursor` for a page fetched with `limit + 1` rows: `Some` exactly
/// when a row beyond the page exists. Trims `rows` to the page.
pub fn finish_page<T>(rows: &mut Vec<T>, limit: u32, key: impl Fn(&T) -> String) -> Option<String> {
    let limit = limit as usize;
    if rows.len() > limit {
        rows.truncate(limit);
        rows.last().map(|last| cursor::encode(&key(last)))
    } else {
        None
    }
}
