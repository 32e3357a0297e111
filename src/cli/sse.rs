//! A small Server-Sent Events parser: bytes in as they arrive, whole
//! messages out. Enough of the WHATWG rules for what drover sends: `event`,
//! `data` (several lines joined with `\n`), `id`, comments, `\n` or `\r\n`
//! line ends, and lines split across chunks.

/// One dispatched message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `message` when the server named no event type.
    pub event: String,
    pub data: String,
    pub id: Option<String>,
}

#[derive(Debug, Default)]
pub struct Parser {
    /// Bytes of a line not yet ended.
    partial: Vec<u8>,
    event: Option<String>,
    data: Vec<String>,
    id: Option<String>,
}

impl Parser {
    /// Feeds a chunk; answers the messages it completed.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<Message> {
        self.partial.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some(end) = self.partial.iter().position(|b| *b == b'\n') {
            let raw: Vec<u8> = self.partial.drain(..=end).collect();
            let line = String::from_utf8_lossy(&raw);
            self.line(line.trim_end_matches(['\n', '\r']), &mut out);
        }
        out
    }

    fn line(&mut self, line: &str, out: &mut Vec<Message>) {
        if line.is_empty() {
            if !self.data.is_empty() || self.event.is_some() {
                out.push(Message {
                    event: self.event.take().unwrap_or_else(|| "message".to_owned()),
                    data: self.data.join("\n"),
                    id: self.id.take(),
                });
                self.data.clear();
            }
            return;
        }
        if line.starts_with(':') {
            return; // A comment: the server's keep-alive.
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = Some(value.to_owned()),
            "data" => self.data.push(value.to_owned()),
            "id" => self.id = Some(value.to_owned()),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(event: &str, data: &str, id: Option<&str>) -> Message {
        Message { event: event.into(), data: data.into(), id: id.map(Into::into) }
    }

    #[test]
    fn messages_are_dispatched_on_blank_lines() {
        let mut p = Parser::default();
        let got = p.push(b"event: status\ndata: {\"a\":1}\n\n: keep-alive\n\nevent: event\nid: 7\ndata: x\n\n");
        assert_eq!(got, vec![msg("status", "{\"a\":1}", None), msg("event", "x", Some("7"))]);
    }

    #[test]
    fn lines_split_across_chunks_and_crlf_are_handled() {
        let mut p = Parser::default();
        assert!(p.push(b"event: sta").is_empty());
        assert!(p.push(b"tus\r\ndata: one\r\ndata:two\r\n").is_empty());
        assert_eq!(p.push(b"\r\n"), vec![msg("status", "one\ntwo", None)]);
    }

    #[test]
    fn data_without_an_event_name_is_a_message() {
        let mut p = Parser::default();
        assert_eq!(p.push(b"data: hi\n\n"), vec![msg("message", "hi", None)]);
    }
}
