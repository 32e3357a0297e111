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

/// A document read from a file, with where it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    pub value: Value,
    /// 1-based; the line of the list for an item of a top-level list.
    pub line: u64,
    /// 1-based position among the file's documents, as a person counts
    /// them: an empty document (`---` followed by nothing) counts too.
    pub number: usize,
    /// For an item of a top-level list: its position in the list, 1-based.
    pub item: Option<usize>,
}

/// Why a file could not be read, and where, when known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{problem}", at.map(|(l, c)| format!("line {l} column {c}: ")).unwrap_or_default())]
pub struct SourceError {
    /// Line and column, 1-based.
    pub at: Option<(u64, u64)>,
    pub problem: Problem,
}

/// What is wrong with a file, in the terms of the person who wrote it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// A file over [`MAX_FILE_BYTES`]; `size` when known (standard input is
    /// read only up to the limit).
    #[error("{}exceeds the limit of {MAX_FILE_BYTES} bytes (8 MiB) for one fleet file; split it into several files", size.map(|s| format!("the file is {s} bytes and ")).unwrap_or_else(|| "the input ".into()))]
    TooLarge { size: Option<u64> },
    #[error("more than {0} documents; split the fleet into several apply sets")]
    TooManyDocuments(usize),
    #[error("key {} appears twice in one mapping; write each key once", key.as_deref().map(|k| format!("{k:?}")).unwrap_or_else(|| "(unnamed)".into()))]
    DuplicateKey { key: Option<String> },
    #[error("nested more than {MAX_DEPTH} levels deep, the limit of a fleet document")]
    TooDeep,
    #[error("aliases would repeat more than {MAX_ALIAS_EVENTS} values, the limit of a fleet file (an alias bomb?)")]
    AliasesTooLarge,
    #[error("more than {MAX_NODES} values, the limit of a fleet file; split it into several files")]
    TooManyValues,
    #[error("the text is not UTF-8")]
    NotUtf8,
    /// The text is not YAML: what the reader says of it.
    #[error("not valid YAML: {0}")]
    Syntax(String),
}

impl SourceError {
    fn new(problem: Problem) -> Self {
        Self { at: None, problem }
    }
}

/// What the reader's error means for the person who wrote the file.
fn problem_of(e: &serde_saphyr::Error, max_documents: usize) -> Problem {
    use serde_saphyr::Error as E;
    use serde_saphyr::budget::BudgetBreach as B;
    use serde_saphyr::granit_parser::ErrorKind;
    match e.without_snippet() {
        E::AliasError { error, .. } => problem_of(error, max_documents),
        E::DuplicateMappingKey { key, .. } => Problem::DuplicateKey { key: key.clone() },
        E::Budget { breach: B::Documents { .. }, .. } => Problem::TooManyDocuments(max_documents),
        E::Budget { breach: B::Depth { .. }, .. } | E::AliasReplayStackDepthExceeded { .. } => Problem::TooDeep,
        E::Budget { breach: B::Nodes { .. }, .. } => Problem::TooManyValues,
        E::Budget { breach: B::ScalarBytes { .. } | B::InputBytes { .. }, .. } => Problem::TooLarge { size: None },
        E::Budget { .. } | E::AliasReplayLimitExceeded { .. } | E::AliasExpansionLimitExceeded { .. } => {
            Problem::AliasesTooLarge
        }
        E::InvalidUtf8Input => Problem::NotUtf8,
        E::ExternalMessage { source, .. }
            if matches!(&**source, serde_saphyr::ExternalMessageSource::Parser(scan)
                if matches!(scan.kind(), ErrorKind::RecursionLimitExceeded)) =>
        {
            Problem::TooDeep
        }
        other => Problem::Syntax(one_line(&other.to_string())),
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
        return Err(too_large(Some(text.len() as u64)));
    }
    let docs: Vec<serde_saphyr::Spanned<Value>> =
        serde_saphyr::from_slice_multiple_with_options(text, options(max_documents)).map_err(|e| {
            let at = e.location().filter(|l| l.line() > 0).map(|l| (l.line(), l.column()));
            SourceError { at, problem: problem_of(&e, max_documents) }
        })?;
    let starts = document_starts(text);
    let mut out = Vec::new();
    for doc in docs {
        let line = doc.referenced.line();
        let number = starts.iter().take_while(|&&start| start <= line).count().max(1);
        match doc.value {
            Value::Array(items) => out.extend(items.into_iter().enumerate().map(|(i, value)| Document {
                value,
                line,
                number,
                item: Some(i + 1),
            })),
            Value::Null => {}
            value => out.push(Document { value, line, number, item: None }),
        }
        if out.len() > max_documents {
            return Err(SourceError::new(Problem::TooManyDocuments(max_documents)));
        }
    }
    Ok(out)
}

/// The line each document of `text` starts on, empty ones too (the
/// reader skips those): a `---` line starts one, and so does the first
/// line of content where none is open (a file without markers, or after
/// `...`). A document's number is how many start at or before its line.
fn document_starts(text: &[u8]) -> Vec<u64> {
    let mut starts = Vec::new();
    let mut open = false;
    for (line, n) in text.split(|&b| b == b'\n').zip(1u64..) {
        let marker = |m: &[u8]| line.starts_with(m) && line.get(3).is_none_or(|b| b.is_ascii_whitespace());
        let trimmed = line.trim_ascii();
        if marker(b"---") {
            starts.push(n);
            open = true;
        } else if marker(b"...") {
            open = false;
        } else if !open && !trimmed.is_empty() && !trimmed.starts_with(b"#") && !line.starts_with(b"%") {
            starts.push(n);
            open = true;
        }
    }
    starts
}

/// The error for a file over [`MAX_FILE_BYTES`]; `size` when known.
pub fn too_large(size: Option<u64>) -> SourceError {
    SourceError::new(Problem::TooLarge { size })
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
