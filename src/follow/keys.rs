//! Keys of the interactive follower: a key event and the input line in, an [`Action`] out.
//! Pure (crossterm's key types are plain data), so every binding is unit-tested.
//!
//! Bindings: printable keys type into the input line; Enter sends it (a `/command` is run
//! instead); Esc cancels the running turn (with nothing running it clears the line); `y` /
//! `n` / `a` answer the pending permission when the line is empty (allow once / deny / allow
//! always); Tab and Shift-Tab select a tool call, Enter on an empty line folds or unfolds the
//! selected one; PageUp / PageDown / End scroll; Ctrl-C and Ctrl-D (empty line) quit.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

/// How a permission request is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    AllowOnce,
    Deny,
    AllowAlways,
}

/// What a key (or a typed `/command`) asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    None,
    Send(String),
    Steer(String),
    Cancel,
    Answer(Answer),
    Fork,
    QueueList,
    /// 1-based, as `/queue` lists them.
    QueueRemove(usize),
    QueueClear,
    ToggleAllTools,
    /// `true`: Tab (to older tools), `false`: Shift-Tab.
    SelectTool(bool),
    ToggleSelected,
    Unselect,
    /// Lines: negative scrolls back (up).
    Scroll(i32),
    ScrollEnd,
    Help,
    Quit,
    Unknown(String),
}

/// What the keys need to know of the view.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyContext {
    pub permission_pending: bool,
    pub turn_running: bool,
    pub tool_selected: bool,
    /// Rows of the transcript (a page for PageUp / PageDown).
    pub page: u16,
}

/// The input line: its text and the cursor (a char index).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Input {
    text: String,
    cursor: usize,
}

impl Input {
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The cursor's column (in chars).
    pub fn cursor(&self) -> usize {
        self.cursor
    }

    fn byte_at(&self, char_index: usize) -> usize {
        self.text
            .char_indices()
            .nth(char_index)
            .map_or(self.text.len(), |(i, _)| i)
    }

    fn insert(&mut self, c: char) {
        let at = self.byte_at(self.cursor);
        self.text.insert(at, c);
        self.cursor += 1;
    }

    fn backspace(&mut self) {
        if self.cursor > 0 {
            self.cursor -= 1;
            let at = self.byte_at(self.cursor);
            self.text.remove(at);
        }
    }

    fn delete(&mut self) {
        if self.cursor < self.text.chars().count() {
            let at = self.byte_at(self.cursor);
            self.text.remove(at);
        }
    }

    fn take(&mut self) -> String {
        self.cursor = 0;
        std::mem::take(&mut self.text)
    }
}

/// One key.
pub fn on_key(input: &mut Input, key: KeyEvent, ctx: KeyContext) -> Action {
    if key.kind == KeyEventKind::Release {
        return Action::None;
    }
    let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
    let page = i32::from(ctx.page.max(2) - 1);
    match key.code {
        KeyCode::Char('c') if ctrl => Action::Quit,
        KeyCode::Char('d') if ctrl && input.text.is_empty() => Action::Quit,
        KeyCode::Char('u') if ctrl => {
            input.take();
            Action::None
        }
        KeyCode::Char(c) if !ctrl => {
            if input.text.is_empty() && ctx.permission_pending {
                match c {
                    'y' => return Action::Answer(Answer::AllowOnce),
                    'n' => return Action::Answer(Answer::Deny),
                    'a' => return Action::Answer(Answer::AllowAlways),
                    _ => {}
                }
            }
            input.insert(c);
            Action::None
        }
        KeyCode::Enter => {
            if input.text.trim().is_empty() {
                input.take();
                return if ctx.tool_selected {
                    Action::ToggleSelected
                } else {
                    Action::None
                };
            }
            parse_line(&input.take())
        }
        KeyCode::Esc => {
            if ctx.turn_running {
                Action::Cancel
            } else if ctx.tool_selected && input.text.is_empty() {
                Action::Unselect
            } else {
                input.take();
                Action::None
            }
        }
        KeyCode::Backspace => {
            input.backspace();
            Action::None
        }
        KeyCode::Delete => {
            input.delete();
            Action::None
        }
        KeyCode::Left => {
            input.cursor = input.cursor.saturating_sub(1);
            Action::None
        }
        KeyCode::Right => {
            input.cursor = (input.cursor + 1).min(input.text.chars().count());
            Action::None
        }
        KeyCode::Home => {
            input.cursor = 0;
            Action::None
        }
        KeyCode::End if input.text.is_empty() => Action::ScrollEnd,
        KeyCode::End => {
            input.cursor = input.text.chars().count();
            Action::None
        }
        KeyCode::Tab => Action::SelectTool(true),
        KeyCode::BackTab => Action::SelectTool(false),
        KeyCode::PageUp => Action::Scroll(-page),
        KeyCode::PageDown => Action::Scroll(page),
        KeyCode::Up => Action::Scroll(-1),
        KeyCode::Down => Action::Scroll(1),
        _ => Action::None,
    }
}

/// A line the user entered: a `/command`, or a prompt to send (`//` at the start sends a
/// prompt that begins with `/`).
pub fn parse_line(line: &str) -> Action {
    let trimmed = line.trim();
    if let Some(rest) = trimmed.strip_prefix("//") {
        return Action::Send(format!("/{rest}"));
    }
    let Some(command) = trimmed.strip_prefix('/') else {
        return Action::Send(line.trim_end().to_owned());
    };
    let (name, arg) = command
        .split_once(char::is_whitespace)
        .map_or((command, ""), |(n, a)| (n, a.trim()));
    match (name, arg) {
        ("quit" | "q" | "exit", _) => Action::Quit,
        ("cancel", _) => Action::Cancel,
        ("steer", "") => Action::Unknown("/steer needs a text: /steer <text>".to_owned()),
        ("steer", text) => Action::Steer(text.to_owned()),
        ("fork", _) => Action::Fork,
        ("tools", _) => Action::ToggleAllTools,
        ("help" | "?", _) => Action::Help,
        ("queue", "") => Action::QueueList,
        ("queue", "clear") => Action::QueueClear,
        ("queue", rest) => {
            let number = rest
                .strip_prefix("rm")
                .or_else(|| rest.strip_prefix("remove"))
                .map(str::trim)
                .and_then(|n| n.parse::<usize>().ok());
            match number {
                Some(n) => Action::QueueRemove(n),
                None => Action::Unknown(format!("/queue {rest}")),
            }
        }
        _ => Action::Unknown(format!("/{name}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    fn typed(input: &mut Input, text: &str, ctx: KeyContext) {
        for c in text.chars() {
            assert_eq!(on_key(input, key(KeyCode::Char(c)), ctx), Action::None);
        }
    }

    #[test]
    fn typing_and_enter_sends_and_slash_commands_parse() {
        let ctx = KeyContext::default();
        let mut input = Input::default();
        typed(&mut input, "helo", ctx);
        on_key(&mut input, key(KeyCode::Left), ctx);
        typed(&mut input, "l", ctx);
        assert_eq!(input.text(), "hello");
        assert_eq!(
            on_key(&mut input, key(KeyCode::Enter), ctx),
            Action::Send("hello".into())
        );
        assert_eq!(input.text(), "");
        for (line, action) in [
            ("/cancel", Action::Cancel),
            ("/steer go left", Action::Steer("go left".into())),
            ("/fork", Action::Fork),
            ("/queue", Action::QueueList),
            ("/queue rm 2", Action::QueueRemove(2)),
            ("/queue clear", Action::QueueClear),
            ("/tools", Action::ToggleAllTools),
            ("/quit", Action::Quit),
            ("//etc/hosts?", Action::Send("/etc/hosts?".into())),
            ("/nope", Action::Unknown("/nope".into())),
        ] {
            assert_eq!(parse_line(line), action, "{line}");
        }
    }

    #[test]
    fn y_n_a_answer_only_on_an_empty_line_with_a_request_pending() {
        let pending = KeyContext {
            permission_pending: true,
            ..KeyContext::default()
        };
        let mut input = Input::default();
        for (c, answer) in [
            ('y', Answer::AllowOnce),
            ('n', Answer::Deny),
            ('a', Answer::AllowAlways),
        ] {
            assert_eq!(
                on_key(&mut input, key(KeyCode::Char(c)), pending),
                Action::Answer(answer)
            );
        }
        // Mid-word they are letters.
        typed(&mut input, "ok yarn", pending);
        assert_eq!(input.text(), "ok yarn");
        // With nothing pending, too.
        let mut input = Input::default();
        typed(&mut input, "yes", KeyContext::default());
        assert_eq!(input.text(), "yes");
    }

    #[test]
    fn esc_cancels_a_running_turn_and_ctrl_c_quits() {
        let running = KeyContext {
            turn_running: true,
            ..KeyContext::default()
        };
        let mut input = Input::default();
        assert_eq!(
            on_key(&mut input, key(KeyCode::Esc), running),
            Action::Cancel
        );
        typed(&mut input, "draft", KeyContext::default());
        // Idle: Esc clears the line.
        assert_eq!(
            on_key(&mut input, key(KeyCode::Esc), KeyContext::default()),
            Action::None
        );
        assert_eq!(input.text(), "");
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(on_key(&mut input, ctrl_c, running), Action::Quit);
    }

    #[test]
    fn tab_selects_tools_and_enter_on_an_empty_line_unfolds() {
        let selected = KeyContext {
            tool_selected: true,
            ..KeyContext::default()
        };
        let mut input = Input::default();
        assert_eq!(
            on_key(&mut input, key(KeyCode::Tab), KeyContext::default()),
            Action::SelectTool(true)
        );
        assert_eq!(
            on_key(&mut input, key(KeyCode::BackTab), selected),
            Action::SelectTool(false)
        );
        assert_eq!(
            on_key(&mut input, key(KeyCode::Enter), selected),
            Action::ToggleSelected
        );
        assert_eq!(
            on_key(&mut input, key(KeyCode::Esc), selected),
            Action::Unselect
        );
        let paged = KeyContext {
            page: 20,
            ..KeyContext::default()
        };
        assert_eq!(
            on_key(&mut input, key(KeyCode::PageUp), paged),
            Action::Scroll(-19)
        );
    }
}
