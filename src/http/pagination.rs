//! Page parameters shared by every list endpoint, read into the store's
//! [`PageRequest`], and a page answered as JSON.

use serde::Deserialize;
use utoipa::IntoParams;

use crate::db::page::{PageRequest, decode_cursor};
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
    fn limit(&self) -> Result<u32, ApiError> {
        match self.limit {
            None => Ok(DEFAULT_LIMIT),
            Some(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
            Some(n) => Err(ApiError::invalid("limit", "range", format!("must be between 1 and {MAX_LIMIT} (got {n})"))),
        }
    }

    /// A page of a list in key order (names).
    pub fn request(&self) -> Result<PageRequest, ApiError> {
        let after = self.cursor.as_deref().map(|c| decode_cursor(c).ok_or_else(bad_cursor)).transpose()?;
        Ok(PageRequest { limit: self.limit()?, after })
    }

    /// A page of a list in id order (events, jobs, tokens).
    pub fn request_by_id(&self) -> Result<PageRequest<i64>, ApiError> {
        let PageRequest { limit, after } = self.request()?;
        let after = after.map(|k| k.parse().map_err(|_| bad_cursor())).transpose()?;
        Ok(PageRequest { limit, after })
    }
}

fn bad_cursor() -> ApiError {
    ApiError::invalid(
        "cursor",
        "cursor",
        "is not a cursor this server issued; pass next_cursor from the previous page unchanged",
    )
}
