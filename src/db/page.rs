//! Pages of a list: what a caller asks for (how many, after which key) and
//! what it gets (the items and the cursor of the next page). Cursors are
//! opaque to clients: base64url of the last key a page returned.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// One page of a list ordered by a key of type `K` (a name, an id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageRequest<K = String> {
    /// Items on the page, at least 1.
    pub limit: u32,
    /// The key of the previous page's last item.
    pub after: Option<K>,
}

impl<K> PageRequest<K> {
    /// Rows to fetch: one more than the page, to know whether another follows.
    pub fn fetch(&self) -> u32 {
        self.limit.saturating_add(1)
    }
}

/// A page of items and the cursor of the next one (`None` on the last).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next_cursor: Option<String>,
}

impl<T> Page<T> {
    /// The page of `rows`, fetched with [`PageRequest::fetch`]: the cursor is
    /// `Some` exactly when a row beyond the page exists.
    pub fn from_rows(mut rows: Vec<T>, limit: u32, key: impl Fn(&T) -> String) -> Self {
        let limit = limit as usize;
        let next_cursor = if rows.len() > limit {
            rows.truncate(limit);
            rows.last().map(|last| encode_cursor(&key(last)))
        } else {
            None
        };
        Self { items: rows, next_cursor }
    }

    pub fn map<U>(self, f: impl FnMut(T) -> U) -> Page<U> {
        Page { items: self.items.into_iter().map(f).collect(), next_cursor: self.next_cursor }
    }
}

pub fn encode_cursor(key: &str) -> String {
    URL_SAFE_NO_PAD.encode(key)
}

/// The key a cursor carries, or `None` for one this server did not issue.
pub fn decode_cursor(cursor: &str) -> Option<String> {
    URL_SAFE_NO_PAD.decode(cursor).ok().and_then(|b| String::from_utf8(b).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_has_a_cursor_only_when_more_rows_follow() {
        let page = Page::from_rows(vec![1, 2, 3], 2, |n| n.to_string());
        assert_eq!(page.items, [1, 2]);
        assert_eq!(page.next_cursor.as_deref().and_then(decode_cursor).as_deref(), Some("2"));
        assert_eq!(Page::from_rows(vec![1, 2], 2, |n| n.to_string()).next_cursor, None);
        assert_eq!(decode_cursor("!!"), None);
    }
}
