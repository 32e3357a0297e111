// The one Server-Sent Events parser of the dashboard.
//
// The browser's EventSource would do this, but it cannot send an
// Authorization header, so the dashboard reads streams with fetch() and
// parses them here. The rules are those of drover's streams (docs/dashboard.md,
// "The stream format") and the same as the CLI's parser (src/cli/sse.rs):
// `event`, `data` (several lines joined with "\n"), `id`; lines starting with
// ":" are comments (keep-alives); a line ends at "\n", a "\r" before it is
// dropped; a blank line ends a message, which is dispatched when it has data
// or an event name; without an event name it is a `message`. Other fields
// are ignored. The browser test feeds it the CLI parser's test cases.

export class SseParser {
  constructor() {
    this.partial = '';
    this.event = null;
    this.data = [];
    this.id = null;
  }

  // Feeds decoded text; answers the messages it completed, as
  // { event, data, id } with id null when the message had none.
  push(text) {
    this.partial += text;
    const out = [];
    let end = this.partial.indexOf('\n');
    while (end >= 0) {
      const line = this.partial.slice(0, end).replace(/\r$/, '');
      this.partial = this.partial.slice(end + 1);
      this.line(line, out);
      end = this.partial.indexOf('\n');
    }
    return out;
  }

  line(line, out) {
    if (line === '') {
      if (this.data.length || this.event !== null) {
        out.push({ event: this.event ?? 'message', data: this.data.join('\n'), id: this.id });
        this.event = null;
        this.data = [];
        this.id = null;
      }
      return;
    }
    if (line.startsWith(':')) return; // a comment: the server's keep-alive
    const i = line.indexOf(':');
    const field = i < 0 ? line : line.slice(0, i);
    let value = i < 0 ? '' : line.slice(i + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'event') this.event = value;
    else if (field === 'data') this.data.push(value);
    else if (field === 'id') this.id = value;
  }
}

// The messages of a text/event-stream body (a ReadableStream of bytes), as
// they arrive. Ends when the body ends; throws when reading it fails.
export async function* sseMessages(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  const parser = new SseParser();
  let ended = false;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) {
        ended = true;
        return;
      }
      // `stream: true` keeps a character split across chunks for the next one.
      yield* parser.push(decoder.decode(value, { stream: true }));
    }
  } finally {
    // The reader stopped early (or the body failed): let go of the connection.
    if (!ended) reader.cancel().catch(() => {});
  }
}
