//! Draws the interactive follower: the transcript (the newest lines, or scrolled back), the
//! panel (pending permission and its keys, the queue), the status bar and the input line.
//! Pure over a ratatui `Frame`: what it draws depends on the [`View`] and the [`Input`]
//! only, so it is tested on ratatui's in-memory backend.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Position};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use unicode_width::UnicodeWidthStr;

use super::keys::Input;
use super::view::{View, clean};

/// Panel lines at most (permission: 2, queue: 1, and room to spare).
const PANEL: usize = 4;

/// Rows of the transcript for a frame of `height` rows (for PageUp / PageDown).
pub fn transcript_rows(view: &View, height: u16) -> u16 {
    let panel = u16::try_from(view.panel_lines(PANEL).len()).unwrap_or(0);
    height.saturating_sub(panel + 2)
}

pub fn draw(frame: &mut Frame, view: &View, input: &Input) {
    let panel = view.panel_lines(PANEL);
    let panel_rows = u16::try_from(panel.len()).unwrap_or(0);
    let [body, panel_area, status_area, input_area] = Layout::vertical([
        Constraint::Min(1),
        Constraint::Length(panel_rows),
        Constraint::Length(1),
        Constraint::Length(1),
    ])
    .areas(frame.area());

    let lines = view.lines(body.width);
    let height = usize::from(body.height);
    let back = view.scroll_back.min(lines.len().saturating_sub(height));
    let end = lines.len() - back;
    let start = end.saturating_sub(height);
    frame.render_widget(Paragraph::new(lines[start..end].to_vec()), body);
    frame.render_widget(Paragraph::new(panel), panel_area);
    frame.render_widget(
        Paragraph::new(view.status_line()).style(Style::default().bg(Color::Black)),
        status_area,
    );

    // The input line shows its end when it is wider than the screen. Everything is counted
    // over the text as drawn (a tab is 4 columns, a control character `^X` two), so the
    // cursor stays where the drawn text puts it.
    let prompt = if input.confirming() {
        "allow always? a / Enter: yes, any other key: no › "
    } else {
        "› "
    };
    let chars: Vec<char> = clean(input.text()).chars().collect();
    let cursor = clean(input.before_cursor())
        .chars()
        .count()
        .min(chars.len());
    let room = usize::from(input_area.width).saturating_sub(prompt.width() + 1);
    let skip = cursor.saturating_sub(room);
    let shown: String = chars.iter().skip(skip).take(room).collect();
    let cursor_x = prompt.width() + chars[skip..cursor].iter().collect::<String>().width();
    frame.render_widget(
        Paragraph::new(Line::from(vec![
            Span::styled(
                prompt,
                Style::default()
                    .fg(Color::Magenta)
                    .add_modifier(Modifier::BOLD),
            ),
            Span::raw(shown),
        ])),
        input_area,
    );
    let x = input_area
        .x
        .saturating_add(u16::try_from(cursor_x).unwrap_or(u16::MAX));
    frame.set_cursor_position(Position::new(
        x.min(input_area.right().saturating_sub(1)),
        input_area.y,
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;
    use serde_json::json;

    fn screen(view: &View, input: &Input, w: u16, h: u16) -> Vec<String> {
        let mut terminal = Terminal::new(TestBackend::new(w, h)).unwrap();
        terminal.draw(|f| draw(f, view, input)).unwrap();
        let buffer = terminal.backend().buffer().clone();
        (0..h)
            .map(|y| {
                (0..w)
                    .map(|x| buffer[(x, y)].symbol().to_owned())
                    .collect::<String>()
                    .trim_end()
                    .to_owned()
            })
            .collect()
    }

    #[test]
    fn the_screen_shows_the_newest_lines_the_permission_and_the_status() {
        let s = "0193bbbb-x";
        let mut view = View::new(Some(s.into()), "t");
        for i in 0..30 {
            view.on_event(&json!({"k":"text.end","sessionId":s,"text":format!("line {i}")}));
        }
        view.on_event(&json!({"k":"run.start","sessionId":s,"runId":"r1"}));
        view.on_event(&json!({"k":"permission.request","sessionId":s,"runId":"r1","requestId":"p","tool":"Bash","input":{"command":"rm -rf build"},"options":["allow","deny"]}));
        let rows = screen(&view, &Input::default(), 60, 12);
        assert_eq!(rows[0], "● line 25");
        assert_eq!(rows[5], "── run r1 started ──");
        assert_eq!(rows[7], "  … waiting for an answer (y / n / a)");
        assert_eq!(rows[8], "? Bash wants to run: rm -rf build");
        assert_eq!(rows[9], "  [y] allow   [n] deny");
        assert!(rows[10].contains("● running run r1"), "{rows:?}");
        assert_eq!(rows[11], "›");
        // Scrolled back: older lines, and the status bar says so.
        view.scroll_back = 3;
        let rows = screen(&view, &Input::default(), 120, 12);
        assert_eq!(rows[0], "● line 22");
        assert!(rows[10].contains("scrolled back 3"), "{rows:?}");
    }

    fn cursor_x(view: &View, input: &Input) -> u16 {
        let mut terminal = Terminal::new(TestBackend::new(40, 4)).unwrap();
        terminal.draw(|f| draw(f, view, input)).unwrap();
        terminal.get_cursor_position().unwrap().x
    }

    #[test]
    fn the_cursor_sits_after_the_drawn_text() {
        use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
        let view = View::new(Some("s".into()), "t");
        let mut input = Input::default();
        let ctx = crate::follow::keys::KeyContext::default();
        // A pasted tab (4 columns drawn) and a control character (`^A`, 2 columns).
        crate::follow::keys::on_paste(&mut input, "a\tb\u{1}c");
        let rows = screen(&view, &input, 40, 4);
        assert_eq!(rows[3], "› a    b^Ac");
        assert_eq!(cursor_x(&view, &input), 2 + 9);
        crate::follow::keys::on_key(
            &mut input,
            KeyEvent::new(KeyCode::Left, KeyModifiers::NONE),
            ctx,
        );
        assert_eq!(cursor_x(&view, &input), 2 + 8);
    }
}
