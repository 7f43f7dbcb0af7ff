//! Reading an agent's stdout line by line with a bound on the line length. An over-long line
//! is skipped (reported as [`Line::TooLong`]) and reading goes on at the next line — unlike a
//! `FramedRead<LinesCodec>`, whose stream ends at the first decoding error.

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// The complete lines of a session file from byte `start`, reading at most `limit` bytes
/// (blocking: call off the runtime). A line `start` falls inside of (one that does not begin
/// at `start`) and a line cut by the limit are left out; `true` when the limit cut the file
/// short.
pub fn read_file_lines(
    file: &std::path::Path,
    start: u64,
    limit: u64,
) -> std::io::Result<(Vec<Vec<u8>>, bool)> {
    use std::io::{BufRead, Read, Seek};
    let mut f = std::fs::File::open(file)?;
    let len = f.metadata()?.len();
    // Whether `start` is inside a line: the byte before it is not a newline.
    let mut inside = false;
    if start > 0 {
        f.seek(std::io::SeekFrom::Start(start - 1))?;
        let mut before = [0u8; 1];
        inside = f.read(&mut before)? == 1 && before[0] != b'\n';
        f.seek(std::io::SeekFrom::Start(start))?;
    }
    let cut = len.saturating_sub(start) > limit;
    let mut reader = std::io::BufReader::new(f.take(limit));
    let mut lines = Vec::new();
    let mut first = true;
    loop {
        let mut line = Vec::new();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        let whole = line.last() == Some(&b'\n');
        let skip = (first && inside) || (!whole && cut);
        first = false;
        if !skip {
            lines.push(line);
        }
    }
    Ok((lines, cut))
}

/// One line read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    Text(String),
    /// Longer than the bound: skipped whole.
    TooLong,
    /// Not UTF-8: skipped.
    NotUtf8,
}

/// Lines of at most `max` bytes (without the newline; a trailing `\r` is dropped).
#[derive(Debug)]
pub struct BoundedLines<R> {
    reader: BufReader<R>,
    max: usize,
    buf: Vec<u8>,
    /// The current line is over the bound: its bytes are dropped until the newline.
    discarding: bool,
}

impl<R: AsyncRead + Unpin> BoundedLines<R> {
    pub fn new(reader: R, max: usize) -> Self {
        BoundedLines {
            reader: BufReader::with_capacity(64 * 1024, reader),
            max,
            buf: Vec::new(),
            discarding: false,
        }
    }

    /// The next line; `None` at the end of the stream. Cancel-safe: a partial line stays
    /// buffered for the next call.
    pub async fn next_line(&mut self) -> std::io::Result<Option<Line>> {
        loop {
            let available = self.reader.fill_buf().await?;
            if available.is_empty() {
                // The end: a last line without a newline still counts.
                if self.buf.is_empty() && !self.discarding {
                    return Ok(None);
                }
                return Ok(Some(self.finish()));
            }
            match available.iter().position(|&b| b == b'\n') {
                Some(end) => {
                    self.take(end);
                    self.reader.consume(end + 1);
                    return Ok(Some(self.finish()));
                }
                None => {
                    let n = available.len();
                    self.take(n);
                    self.reader.consume(n);
                }
            }
        }
    }

    /// Keep the first `n` bytes of what the reader holds, unless the line is over the bound.
    fn take(&mut self, n: usize) {
        if self.discarding {
            return;
        }
        if self.buf.len() + n > self.max {
            self.discarding = true;
            self.buf = Vec::new();
            return;
        }
        let available = self.reader.buffer();
        self.buf.extend_from_slice(&available[..n]);
    }

    fn finish(&mut self) -> Line {
        if std::mem::take(&mut self.discarding) {
            return Line::TooLong;
        }
        let mut bytes = std::mem::take(&mut self.buf);
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
        match String::from_utf8(bytes) {
            Ok(text) => Line::Text(text),
            Err(_) => Line::NotUtf8,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn all(input: &[u8], max: usize) -> Vec<Line> {
        let mut lines = BoundedLines::new(input, max);
        let mut out = Vec::new();
        while let Some(line) = lines.next_line().await.unwrap() {
            out.push(line);
        }
        out
    }

    /// A start at a line's beginning keeps that line; a start inside one skips to the next;
    /// a limit that cuts a line leaves it out and says so.
    #[test]
    fn file_lines_from_a_start_keep_the_line_that_begins_there() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("s.jsonl");
        std::fs::write(&file, b"one\ntwo\nthree\n").unwrap();
        let read = |start, limit| read_file_lines(&file, start, limit).unwrap();
        assert_eq!(
            read(0, 100),
            (
                vec![b"one\n".to_vec(), b"two\n".to_vec(), b"three\n".to_vec()],
                false
            )
        );
        assert_eq!(
            read(4, 100),
            (vec![b"two\n".to_vec(), b"three\n".to_vec()], false)
        );
        assert_eq!(read(5, 100), (vec![b"three\n".to_vec()], false));
        assert_eq!(read(0, 6), (vec![b"one\n".to_vec()], true));
        assert_eq!(read(14, 100), (vec![], false));
    }

    #[tokio::test]
    async fn long_lines_are_skipped_and_reading_goes_on() {
        let text = |s: &str| Line::Text(s.to_owned());
        assert_eq!(
            all(b"ab\r\n0123456789\ncd\n\xff\xfe\nlast", 5).await,
            [
                text("ab"),
                Line::TooLong,
                text("cd"),
                Line::NotUtf8,
                text("last")
            ]
        );
        assert_eq!(all(b"", 5).await, []);
        assert_eq!(all(b"toolongtail", 5).await, [Line::TooLong]);
        assert_eq!(all(b"\n\n", 5).await, [text(""), text("")]);
    }
}
