//! The view as styled lines: the transcript (each entry's lines, code blocks set apart, tools
//! folded or not, wrapped to the width, labelled with their session when following all), the
//! panel under it and the status bar. Pure, like the rest of the view model.

use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use unicode_width::UnicodeWidthChar;

use super::{Entry, Pending, Queued, Tone, View, one_line, short_id};

/// How many characters of a tool's input its folded line shows.
const FOLDED_INPUT: usize = 80;
/// How many lines of a tool's output an unfolded tool shows.
const UNFOLDED_LINES: usize = 40;

impl View {
    /// The transcript as lines `width` columns wide (wrapped; labelled with their session when
    /// following all).
    pub fn lines(&self, width: u16) -> Vec<Line<'static>> {
        let width = usize::from(width.max(10));
        let mut out = Vec::new();
        for (index, entry) in self.entries.iter().enumerate() {
            let label = match (&self.followed, entry.session()) {
                (None, Some(session)) => Some(Span::styled(
                    format!("[{}] ", short_id(session)),
                    Style::default().fg(label_color(session)),
                )),
                (None, None) => Some(Span::raw("           ")),
                _ => None,
            };
            for line in self.entry_lines(index, entry) {
                let line = match &label {
                    Some(label) => {
                        let mut spans = vec![label.clone()];
                        spans.extend(line.spans);
                        Line::from(spans)
                    }
                    None => line,
                };
                out.extend(wrap(line, width));
            }
        }
        out
    }

    fn entry_lines(&self, index: usize, entry: &Entry) -> Vec<Line<'static>> {
        match entry {
            Entry::Mark { text, tone, .. } => vec![Line::styled(text.clone(), tone.style())],
            Entry::Prompt {
                who, text, steer, ..
            } => {
                let head = if *steer {
                    format!("{who} (steer) ▸ ")
                } else {
                    format!("{who} ▸ ")
                };
                let style = Style::default()
                    .fg(Color::Magenta)
                    .add_modifier(Modifier::BOLD);
                let mut lines = Vec::new();
                for (i, part) in text.split('\n').enumerate() {
                    let lead = if i == 0 {
                        head.clone()
                    } else {
                        " ".repeat(head.chars().count())
                    };
                    lines.push(Line::from(vec![
                        Span::styled(lead, style),
                        Span::styled(part.to_owned(), Style::default().fg(Color::White)),
                    ]));
                }
                lines
            }
            Entry::Block {
                thinking,
                text,
                open,
                ..
            } => block_lines(text, *thinking, *open),
            Entry::Tool {
                name,
                input,
                output,
                done,
                is_error,
                exit_code,
                expanded,
                ..
            } => {
                let selected = self.selected == Some(index);
                let (mark, tone) = match (done, is_error) {
                    (false, _) => ("…", Tone::Warn),
                    (true, false) => ("✓", Tone::Good),
                    (true, true) => ("✗", Tone::Bad),
                };
                let count = output.lines().count();
                let summary = match (done, exit_code, count) {
                    (false, _, 0) => "running".to_owned(),
                    (false, _, n) => format!("running, {n} lines"),
                    (true, Some(code), n) if *is_error => format!("exit {code}, {n} lines"),
                    (true, _, 1) => "1 line".to_owned(),
                    (true, _, n) => format!("{n} lines"),
                };
                let fold = if *expanded { "▾" } else { "▸" };
                let mut head = vec![
                    Span::styled(format!("{fold} ⚙ "), Tone::Accent.style()),
                    Span::styled(name.clone(), Style::default().add_modifier(Modifier::BOLD)),
                    Span::raw(format!(" {} ", one_line(input, FOLDED_INPUT))),
                    Span::styled(format!("{mark} {summary}"), tone.style()),
                ];
                if selected {
                    head.insert(0, Span::styled("» ", Tone::Warn.style()));
                    for span in &mut head {
                        span.style = span.style.add_modifier(Modifier::REVERSED);
                    }
                }
                let mut lines = vec![Line::from(head)];
                if *expanded {
                    let all: Vec<&str> = output.lines().collect();
                    for line in all.iter().take(UNFOLDED_LINES) {
                        lines.push(Line::from(vec![
                            Span::styled("    │ ", Tone::Dim.style()),
                            Span::styled((*line).to_owned(), tone_for_output(*is_error)),
                        ]));
                    }
                    if all.len() > UNFOLDED_LINES {
                        lines.push(Line::styled(
                            format!("    │ … {} more lines", all.len() - UNFOLDED_LINES),
                            Tone::Dim.style(),
                        ));
                    }
                    if all.is_empty() {
                        lines.push(Line::styled("    │ (no output)", Tone::Dim.style()));
                    }
                }
                lines
            }
            Entry::Permission {
                tool,
                input,
                answer,
                ..
            } => {
                let mut lines = vec![Line::from(vec![
                    Span::styled(
                        "? permission: ",
                        Tone::Warn.style().add_modifier(Modifier::BOLD),
                    ),
                    Span::styled(tool.clone(), Style::default().add_modifier(Modifier::BOLD)),
                    Span::raw(format!(" {}", one_line(input, 200))),
                ])];
                match answer {
                    Some(answer) => lines.push(Line::styled(
                        format!("  → {answer}"),
                        if answer.starts_with("allow") {
                            Tone::Good.style()
                        } else {
                            Tone::Warn.style()
                        },
                    )),
                    None => lines.push(Line::styled(
                        "  … waiting for an answer (y / n / a)",
                        Tone::Warn.style(),
                    )),
                }
                lines
            }
            Entry::Notice { text, tone, .. } => text
                .split('\n')
                .map(|l| Line::styled(l.to_owned(), tone.style()))
                .collect(),
        }
    }

    /// The lines under the transcript: the pending permission with its choices, and the
    /// queue (as many as fit in `max`).
    pub fn panel_lines(&self, max: usize) -> Vec<Line<'static>> {
        let mut out = Vec::new();
        if let Some((session, pending)) = self.pending() {
            let who = if self.followed.is_none() {
                format!("[{}] ", short_id(session))
            } else {
                String::new()
            };
            out.push(Line::from(vec![
                Span::styled(
                    format!("{who}? {} wants to run: ", pending.tool),
                    Tone::Warn.style().add_modifier(Modifier::BOLD),
                ),
                Span::raw(one_line(&pending.input, 120)),
            ]));
            let mut keys = vec![
                Span::styled("  [y] ", Tone::Good.style().add_modifier(Modifier::BOLD)),
                Span::raw(choice_label(pending, "allow_once", "allow", "allow once")),
            ];
            if let Some(always) = pending
                .choices
                .iter()
                .find(|c| c.kind == "allow_always" || c.id == "allow_always")
            {
                keys.push(Span::styled(
                    "   [a] ",
                    Tone::Good.style().add_modifier(Modifier::BOLD),
                ));
                keys.push(Span::raw(always.label.clone()));
                if !always.rule.is_empty() && always.rule != always.label {
                    keys.push(Span::styled(
                        format!(" ({})", always.rule),
                        Tone::Dim.style(),
                    ));
                }
            }
            keys.push(Span::styled(
                "   [n] ",
                Tone::Bad.style().add_modifier(Modifier::BOLD),
            ));
            keys.push(Span::raw(choice_label(
                pending,
                "reject_once",
                "deny",
                "deny",
            )));
            out.push(Line::from(keys));
        } else if let Some((session, pending)) = self.elsewhere() {
            // Another session's request: keys answer only the target's, so say how.
            out.push(Line::from(vec![
                Span::styled(
                    format!("[{}] ? {} wants to run: ", short_id(session), pending.tool),
                    Tone::Warn.style().add_modifier(Modifier::BOLD),
                ),
                Span::raw(one_line(&pending.input, 80)),
                Span::styled(
                    format!(" — /to {} (or Ctrl-N) to answer it", short_id(session)),
                    Tone::Dim.style(),
                ),
            ]));
        }
        if let Some(status) = self.target_status()
            && !status.queue.is_empty()
        {
            let mut spans = vec![Span::styled(
                format!("queue ({}): ", status.queue.len()),
                Tone::Accent.style(),
            )];
            for (i, item) in status.queue.iter().enumerate() {
                spans.push(Span::raw(format!("{}. {}  ", i + 1, queue_label(item))));
            }
            out.push(Line::from(spans));
        }
        out.truncate(max);
        out
    }

    /// The status bar: session, state, run, connection.
    pub fn status_line(&self) -> Line<'static> {
        let mut spans = Vec::new();
        match (&self.followed, self.target_status()) {
            (Some(session), status) => {
                spans.push(Span::styled(
                    format!(" {} ", short_id(session)),
                    Style::default().add_modifier(Modifier::BOLD),
                ));
                if let Some(status) = status {
                    if let Some(agent) = &status.agent {
                        spans.push(Span::raw(format!("{agent} ")));
                    }
                    if let Some(title) = &status.title {
                        spans.push(Span::raw(format!("“{}” ", one_line(title, 30))));
                    }
                }
            }
            (None, _) => {
                spans.push(Span::styled(
                    " all sessions ",
                    Style::default().add_modifier(Modifier::BOLD),
                ));
                match self.target() {
                    Some(target) => spans.push(Span::styled(
                        format!("→ {} ", short_id(target)),
                        Tone::Accent.style().add_modifier(Modifier::BOLD),
                    )),
                    None => spans.push(Span::styled(
                        "→ no target (/to or Ctrl-N) ",
                        Tone::Warn.style(),
                    )),
                }
            }
        }
        let status = self.target_status();
        let state = status
            .map(|s| s.state.as_str())
            .filter(|s| !s.is_empty())
            .unwrap_or("idle");
        let tone = match state {
            "running" => Tone::Accent,
            "waiting" => Tone::Warn,
            _ => Tone::Good,
        };
        spans.push(Span::styled(format!("● {state} "), tone.style()));
        if let Some(run) = status.and_then(|s| s.run_id.as_deref()) {
            spans.push(Span::styled(
                format!("run {} ", short_id(run)),
                Tone::Dim.style(),
            ));
        }
        if let Some(n) = status.map(|s| s.queue.len()).filter(|n| *n > 0) {
            spans.push(Span::styled(format!("queue {n} "), Tone::Accent.style()));
        }
        spans.push(Span::styled(
            format!("· {} ", self.connection),
            Tone::Dim.style(),
        ));
        if self.scroll_back > 0 {
            spans.push(Span::styled(
                format!("· scrolled back {} (End) ", self.scroll_back),
                Tone::Warn.style(),
            ));
        }
        spans.push(Span::styled(
            "· Enter send · Esc clear/cancel · Tab tools · /help",
            Tone::Dim.style(),
        ));
        Line::from(spans)
    }
}

pub(super) fn queue_label(item: &Queued) -> String {
    if item.text.is_empty() {
        format!("run {}", short_id(&item.run_id))
    } else {
        one_line(&item.text, 40)
    }
}

fn choice_label(pending: &Pending, kind: &str, name: &str, fallback: &str) -> String {
    pending
        .choices
        .iter()
        .find(|c| c.kind == kind || (c.kind.is_empty() && c.id == name))
        .map_or_else(|| fallback.to_owned(), |c| c.label.clone())
}

fn tone_for_output(is_error: bool) -> Style {
    if is_error {
        Tone::Bad.style()
    } else {
        Style::default()
    }
}

/// A stable colour per session, for its label.
fn label_color(session: &str) -> Color {
    const COLORS: [Color; 6] = [
        Color::Cyan,
        Color::Magenta,
        Color::Yellow,
        Color::Blue,
        Color::Green,
        Color::LightRed,
    ];
    let sum: usize = session.bytes().map(usize::from).sum();
    COLORS[sum % COLORS.len()]
}

/// A text or thinking block: prose as it is, fenced code set apart (a frame, its own colour).
fn block_lines(text: &str, thinking: bool, open: bool) -> Vec<Line<'static>> {
    let prose = if thinking {
        Style::default()
            .fg(Color::DarkGray)
            .add_modifier(Modifier::ITALIC)
    } else {
        Style::default()
    };
    let code = Style::default().fg(Color::LightCyan);
    let frame = Tone::Dim.style();
    let head = if thinking { "∴ " } else { "● " };
    let mut lines = Vec::new();
    let mut in_code = false;
    for (i, raw) in text.split('\n').enumerate() {
        let lead = if i == 0 {
            Span::styled(head, if thinking { frame } else { Tone::Good.style() })
        } else {
            Span::raw("  ")
        };
        let fence = raw.trim_start().strip_prefix("```");
        let line = match fence {
            Some(lang) if !in_code => {
                in_code = true;
                let lang = lang.trim();
                let title = if lang.is_empty() {
                    "╭─ code".to_owned()
                } else {
                    format!("╭─ {lang}")
                };
                Line::from(vec![lead, Span::styled(title, frame)])
            }
            Some(_) => {
                in_code = false;
                Line::from(vec![lead, Span::styled("╰─", frame)])
            }
            None if in_code => Line::from(vec![
                lead,
                Span::styled("│ ", frame),
                Span::styled(raw.to_owned(), code),
            ]),
            None => {
                let style = if raw.starts_with('#') {
                    prose.add_modifier(Modifier::BOLD)
                } else {
                    prose
                };
                Line::from(vec![lead, Span::styled(raw.to_owned(), style)])
            }
        };
        lines.push(line);
    }
    if open && let Some(last) = lines.last_mut() {
        last.spans.push(Span::styled("▌", Tone::Dim.style()));
    }
    lines
}

/// A line cut into lines at most `width` columns wide (by character, keeping styles).
pub fn wrap(line: Line<'static>, width: usize) -> Vec<Line<'static>> {
    let mut out = Vec::new();
    let mut current: Vec<Span<'static>> = Vec::new();
    let mut used = 0;
    let base = line.style;
    for mut span in line.spans {
        // The line's own style goes onto its spans: the lines cut from it are rebuilt.
        span.style = base.patch(span.style);
        let mut piece = String::new();
        for c in span.content.chars() {
            let w = c.width().unwrap_or(0);
            if used + w > width && used > 0 {
                if !piece.is_empty() {
                    current.push(Span::styled(std::mem::take(&mut piece), span.style));
                }
                out.push(Line::from(std::mem::take(&mut current)));
                used = 0;
            }
            piece.push(c);
            used += w;
        }
        if !piece.is_empty() {
            current.push(Span::styled(piece, span.style));
        }
    }
    out.push(Line::from(current));
    out
}
