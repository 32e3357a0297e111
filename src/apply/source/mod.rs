//! Fleet files: YAML or JSON text, one or many documents, read into JSON
//! values within limits.
//!
//! YAML is read by serde-saphyr (a YAML 1.2 reader in safe Rust; JSON is
//! YAML, so one reader and one set of limits serves both). Its budgets are
//! what make a hostile file cheap to refuse: an alias bomb (a billion
//! laughs) stops once aliases would replay more than [`MAX_ALIAS_EVENTS`]
//! events, long before it costs memory; deep nesting stops at
//! [`MAX_DEPTH`]; a file larger than [`MAX_FILE_BYTES`] is refused before
//! it is read. Duplicate keys are an error (two readers could disagree on
//! which one counts), and only `true`/`false` are booleans (`no`, a
//! country code, stays a string).
//!
//! A top-level list is a list of documents, as `kubectl` reads one.

use serde_json::Value;

/// Largest fleet file: several thousand pools with room to spare. A larger
/// file is refused before it is read, so a 100 MB file costs nothing.
pub const MAX_FILE_BYTES: u64 = 8 * 1024 * 1024;

/// Deepest nesting of a document. The deepest field of any kind is four
/// levels down (`spec.strategy.max_surge`, a mount in a list); 32 leaves
/// room and stops a nesting bomb before it costs stack or time.
pub const MAX_DEPTH: usize = 32;

/// Most events aliases may replay in one file. An alias repeats a block
/// (shared labels, a common strategy: under ten events) in each of a few
/// thousand documents; a bomb multiplies one block into billions. 100,000
/// events is the first with room to spare, and stops the second once it
/// has cost some 20 MB.
pub const MAX_ALIAS_EVENTS: usize = 100_000;

/// Most nodes (values) in one file: a few thousand documents of a few
/// dozen values each.
pub const MAX_NODES: usize = 1_000_000;

/// A document read from a file, with the line it starts on.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    pub value: Value,
    /// 1-based; the line of the list for an item of a top-level list.
    pub line: u64,
    /// For an item of a top-level list: its position in the list.
    pub item: Option<usize>,
}

/// Why a file could not be read, with where, when known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", at.map(|(l, c)| format!("line {l} column {c}: ")).unwrap_or_default())]
pub struct SourceError {
    pub at: Option<(u64, u64)>,
    pub message: String,
}

impl SourceError {
    fn new(message: impl Into<String>) -> Self {
        Self { at: None, message: message.into() }
    }
}

fn options(max_documents: usize) -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_depth = MAX_DEPTH;
    budget.flow_nesting_limit = MAX_DEPTH;
    budget.max_documents = max_documents;
    budget.max_nodes = MAX_NODES;
    budget.max_total_scalar_bytes = MAX_FILE_BYTES as usize;
    // Many aliases of one anchor are how a fleet shares a block; what a
    // bomb costs is bounded by the replayed events instead.
    budget.enforce_alias_anchor_ratio = false;
    let mut aliases = serde_saphyr::options::AliasLimits::default();
    aliases.max_total_replayed_events = MAX_ALIAS_EVENTS;
    aliases.max_replay_stack_depth = MAX_DEPTH;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options.alias_limits = aliases;
    options.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::Error;
    options.strict_booleans = true;
    options.with_snippet = false;
    options
}

/// The documents of one file's text; at most `max_documents` of them.
pub fn read(text: &[u8], max_documents: usize) -> Result<Vec<Document>, SourceError> {
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large(text.len() as u64));
    }
    let docs: Vec<serde_saphyr::Spanned<Value>> =
        serde_saphyr::from_slice_multiple_with_options(text, options(max_documents)).map_err(|e| {
            let at = e.location().filter(|l| l.line() > 0).map(|l| (l.line(), l.column()));
            let message = one_line(&e.to_string());
            let message = if message.contains("budget breached: Documents") {
                format!("more than {max_documents} documents")
            } else {
                message
            };
            SourceError { at, message }
        })?;
    let mut out = Vec::new();
    for doc in docs {
        let line = doc.referenced.line();
        match doc.value {
            Value::Array(items) => {
                out.extend(items.into_iter().enumerate().map(|(i, value)| Document { value, line, item: Some(i) }));
            }
            Value::Null => {}
            value => out.push(Document { value, line, item: None }),
        }
        if out.len() > max_documents {
            return Err(SourceError::new(format!("more than {max_documents} documents")));
        }
    }
    Ok(out)
}

/// The error for a file over [`MAX_FILE_BYTES`].
pub fn too_large(size: u64) -> SourceError {
    SourceError::new(format!(
        "the file is {size} bytes; a fleet file may be at most {MAX_FILE_BYTES} bytes (split it into several files)"
    ))
}

/// The reader's message on one line, without the position (given apart).
fn one_line(message: &str) -> String {
    let first = message.lines().find(|l| !l.trim().is_empty()).unwrap_or(message).trim();
    match first.find(" at line ") {
        Some(i) => first[..i].to_owned(),
        None => first.to_owned(),
    }
}

#[cfg(test)]
mod tests;
