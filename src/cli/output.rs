//! What the client prints: aligned tables and `key: value` blocks for
//! people, or the server's JSON, pretty-printed, for scripts. Results go to
//! standard output; progress and errors go to standard error, so that
//! `-o json | jq` always sees one JSON document.

use clap::ValueEnum;
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Aligned columns for people.
    Table,
    /// The server's JSON, pretty-printed.
    Json,
}

/// Prints `value` as pretty JSON.
pub fn print_json(value: &Value) {
    match serde_json::to_string_pretty(value) {
        Ok(s) => println!("{s}"),
        // Serializing a `Value` cannot fail; keep the output parseable anyway.
        Err(_) => println!("{value}"),
    }
}

/// A field of a JSON object as display text: strings bare, `null` and
/// missing as `-`, everything else as JSON.
pub fn text(v: &Value, key: &str) -> String {
    cell(&v[key])
}

pub fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A table with a header row; columns are as wide as their widest cell.
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&str]) -> Self {
        Self { rows: vec![headers.iter().map(|h| (*h).to_owned()).collect()] }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|i| self.rows.iter().filter_map(|r| r.get(i)).map(|c| c.chars().count()).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (i, c) in row.iter().enumerate() {
                let pad = widths.get(i).copied().unwrap_or(0);
                line.push_str(&format!("{c:<pad$}  "));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }

    pub fn print(&self) {
        print!("{}", self.render());
    }
}

/// `key: value` lines, keys aligned.
pub fn print_fields(fields: &[(&str, String)]) {
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    for (k, v) in fields {
        println!("{:<width$} {v}", format!("{k}:"));
    }
}

/// The `items` of a list answer.
pub fn items(page: &Value) -> &[Value] {
    page["items"].as_array().map(Vec::as_slice).unwrap_or_default()
}

/// Tells a person how to get the next page, on standard error.
pub fn more_hint(page: &Value) {
    if let Some(cursor) = page["next_cursor"].as_str() {
        eprintln!("(more: repeat with --cursor {cursor})");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tables_align_columns_and_trim_line_ends() {
        let mut t = Table::new(&["NAME", "READY"]);
        t.row(vec!["workers".into(), "3/3".into()]);
        t.row(vec!["a".into(), "-".into()]);
        assert_eq!(t.render(), "NAME     READY\nworkers  3/3\na        -\n");
    }

    #[test]
    fn cells_show_strings_bare_and_nothing_as_a_dash() {
        let v = json!({"s": "x", "n": 3, "z": null});
        assert_eq!(
            (text(&v, "s"), text(&v, "n"), text(&v, "z"), text(&v, "missing")),
            ("x".into(), "3".into(), "-".into(), "-".into())
        );
    }
}
