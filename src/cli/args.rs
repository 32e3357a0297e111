//! Arguments several command groups share: `--wait`/`--timeout` and the
//! paging of lists.

use std::time::Duration;

use clap::Args;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use crate::config::parse_duration;

/// `--wait` and `--timeout`, for commands that start work.
#[derive(Debug, Clone, Copy, Args)]
pub struct WaitArgs {
    /// Block until the work finishes, showing progress; exit 3 if it fails, 4 on timeout.
    #[arg(long)]
    pub wait: bool,

    /// Longest `--wait` (e.g. 90s, 10m, 1h).
    #[arg(long, value_parser = parse_duration, default_value = "10m", requires = "wait")]
    pub timeout: Duration,
}

/// One page of a list: the server answers at most `--limit` items and a
/// cursor for the next page.
#[derive(Debug, Clone, Default, Args)]
pub struct PageArgs {
    /// Items per page, 1-500 (the server's default is 50).
    #[arg(long)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[arg(long)]
    pub cursor: Option<String>,
}

impl PageArgs {
    /// `path` with the paging parameters and `extra` ones as a query string.
    pub fn query(&self, path: &str) -> String {
        self.query_with(path, &[])
    }

    pub fn query_with(&self, path: &str, extra: &[(&str, Option<&str>)]) -> String {
        let limit = self.limit.map(|l| l.to_string());
        let params: Vec<String> = [("limit", limit.as_deref()), ("cursor", self.cursor.as_deref())]
            .iter()
            .chain(extra)
            .filter_map(|(k, v)| v.map(|v| format!("{k}={}", encode(v))))
            .collect();
        if params.is_empty() { path.to_owned() } else { format!("{path}?{}", params.join("&")) }
    }
}

/// Everything but RFC 3986's unreserved characters is escaped in a query value.
const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

fn encode(v: &str) -> String {
    utf8_percent_encode(v, QUERY_VALUE).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_queries_carry_only_what_was_given_and_encode_it() {
        let none = PageArgs::default();
        assert_eq!(none.query("/v1/pools"), "/v1/pools");
        let page = PageArgs { limit: Some(5), cursor: Some("a b".into()) };
        assert_eq!(
            page.query_with("/v1/upgrades", &[("state", Some("failed")), ("cluster", None)]),
            "/v1/upgrades?limit=5&cursor=a%20b&state=failed"
        );
    }
}
