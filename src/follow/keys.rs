//! Keys of the interactive follower: a key event and the input line in, an [`Action`] out.
//! Pure (crossterm's key types are plain data), so every binding is unit-tested.
//!
//! Bindings: printable keys type into the input line; Enter sends it (a `/command` is run
//! instead); Esc clears a line with text on it, and only on an empty line cancels the running
//! turn (or drops the tool selection first); `y` / `n` answer the target session's pending
//! permission when the line is empty (allow once / deny), `a` asks first (a lasting rule: a
//! second `a` or Enter grants it, any other key takes the question back); a paste (bracketed)
//! is always text, never an answer; Ctrl-N / Ctrl-P pick the target session when following all
//! of them; Tab and Shift-Tab select a tool call, Enter on an empty line folds or unfolds the
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
    /// `a` once: ask to confirm the allow-always rule (the view says what the rule is).
    ConfirmAlways,
    /// The confirmation was taken back (a key other than `a` or Enter).
    ConfirmCancelled,
    /// Ctrl-N (`true`) / Ctrl-P: the next / previous session as the target.
    CycleTarget(bool),
    /// `/to <id-or-suffix>`; empty: list the sessions.
    Target(String),
    Unknown(String),
}

/// What the keys need to know of the view.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyContext {
    /// A permission request of the target session waits (only those are answered by keys).
    pub permission_pending: bool,
    /// That request offers an allow-always option.
    pub always_offered: bool,
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
    /// `a` was pressed once: the next key confirms (`a`, Enter) or takes it back.
    confirming: bool,
}

impl Input {
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The text left of the cursor.
    pub fn before_cursor(&self) -> &str {
        &self.text[..self.byte_at(self.cursor)]
    }

    /// Whether an allow-always answer waits for its confirmation.
    pub fn confirming(&self) -> bool {
        self.confirming
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

/// Pasted text (bracketed paste): typed into the line as it is, never an answer. Line breaks
/// become spaces (a paste is one prompt, sent with Enter).
pub fn on_paste(input: &mut Input, text: &str) -> Action {
    let was_confirming = std::mem::take(&mut input.confirming);
    for c in text.chars() {
        input.insert(match c {
            '\r' | '\n' => ' ',
            c => c,
        });
    }
    if was_confirming {
        Action::ConfirmCancelled
    } else {
        Action::None
    }
}

/// One key.
pub fn on_key(input: &mut Input, key: KeyEvent, ctx: KeyContext) -> Action {
    if key.kind == KeyEventKind::Release {
        return Action::None;
    }
    let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
    let page = i32::from(ctx.page.max(2) - 1);
    if std::mem::take(&mut input.confirming) && ctx.permission_pending {
        // The second key of `a`: only `a` or Enter grant the lasting rule; any other key
        // (Ctrl-C aside) only takes the question back.
        return match key.code {
            KeyCode::Char('a') | KeyCode::Enter if !ctrl => Action::Answer(Answer::AllowAlways),
            KeyCode::Char('c') if ctrl => Action::Quit,
            _ => Action::ConfirmCancelled,
        };
    }
    match key.code {
        KeyCode::Char('c') if ctrl => Action::Quit,
        KeyCode::Char('d') if ctrl && input.text.is_empty() => Action::Quit,
        KeyCode::Char('u') if ctrl => {
            input.take();
            Action::None
        }
        KeyCode::Char('n') if ctrl => Action::CycleTarget(true),
        KeyCode::Char('p') if ctrl => Action::CycleTarget(false),
        KeyCode::Char(c) if !ctrl => {
            if input.text.is_empty() && ctx.permission_pending {
                match c {
                    'y' => return Action::Answer(Answer::AllowOnce),
                    'n' => return Action::Answer(Answer::Deny),
                    // Without an allow-always option the view says so (and the `a` is not
                    // typed either: the key means the same whatever the request offers).
                    'a' if ctx.always_offered => {
                        input.confirming = true;
                        return Action::ConfirmAlways;
                    }
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
            if !input.text.is_empty() {
                // A draft is cleared, never a reason to cancel the turn.
                input.take();
                Action::None
            } else if ctx.tool_selected {
                Action::Unselect
            } else if ctx.turn_running {
                Action::Cancel
            } else {
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
        ("to", arg) => Action::Target(arg.to_owned()),
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

    fn ctrl(c: char) -> KeyEvent {
        KeyEvent::new(KeyCode::Char(c), KeyModifiers::CONTROL)
    }

    const PENDING: KeyContext = KeyContext {
        permission_pending: true,
        always_offered: true,
        turn_running: true,
        tool_selected: false,
        page: 0,
    };

    #[test]
    fn y_n_answer_only_on_an_empty_line_with_a_request_of_the_target_pending() {
        let mut input = Input::default();
        for (c, answer) in [('y', Answer::AllowOnce), ('n', Answer::Deny)] {
            assert_eq!(
                on_key(&mut input, key(KeyCode::Char(c)), PENDING),
                Action::Answer(answer)
            );
            assert_eq!(input.text(), "");
        }
        // Mid-word they are letters.
        typed(&mut input, "x", PENDING);
        typed(&mut input, "ok yarn", PENDING);
        assert_eq!(input.text(), "xok yarn");
        // With nothing pending for the target (another session's request does not count:
        // the view says `permission_pending` only for the target), a prompt's first letter
        // is a letter: "no, use …" and "add tests" are typed, not answers.
        for prompt in ["no, use x", "add tests", "yes"] {
            let mut input = Input::default();
            typed(&mut input, prompt, KeyContext::default());
            assert_eq!(input.text(), prompt);
        }
    }

    #[test]
    fn a_asks_for_confirmation_and_any_other_key_takes_it_back() {
        let mut input = Input::default();
        // `a` then `a`: granted.
        assert_eq!(
            on_key(&mut input, key(KeyCode::Char('a')), PENDING),
            Action::ConfirmAlways
        );
        assert!(input.confirming());
        assert_eq!(
            on_key(&mut input, key(KeyCode::Char('a')), PENDING),
            Action::Answer(Answer::AllowAlways)
        );
        assert!(!input.confirming());
        // `a` then Enter: granted.
        on_key(&mut input, key(KeyCode::Char('a')), PENDING);
        assert_eq!(
            on_key(&mut input, key(KeyCode::Enter), PENDING),
            Action::Answer(Answer::AllowAlways)
        );
        // `a` then `d` (the user was typing "add tests"): taken back, nothing typed, and the
        // next keys are text again only once the line has text.
        on_key(&mut input, key(KeyCode::Char('a')), PENDING);
        assert_eq!(
            on_key(&mut input, key(KeyCode::Char('d')), PENDING),
            Action::ConfirmCancelled
        );
        assert!(!input.confirming());
        assert_eq!(input.text(), "");
        // Esc takes it back too (and does not cancel the turn).
        on_key(&mut input, key(KeyCode::Char('a')), PENDING);
        assert_eq!(
            on_key(&mut input, key(KeyCode::Esc), PENDING),
            Action::ConfirmCancelled
        );
        // The request was answered elsewhere meanwhile: the key is an ordinary key.
        on_key(&mut input, key(KeyCode::Char('a')), PENDING);
        assert_eq!(
            on_key(&mut input, key(KeyCode::Char('z')), KeyContext::default()),
            Action::None
        );
        assert_eq!(input.text(), "z");
        // No allow-always option: `a` is neither typed nor a question; the view says so.
        let mut input = Input::default();
        let no_always = KeyContext {
            always_offered: false,
            ..PENDING
        };
        assert_eq!(
            on_key(&mut input, key(KeyCode::Char('a')), no_always),
            Action::Answer(Answer::AllowAlways)
        );
        assert_eq!(input.text(), "");
        assert!(!input.confirming());
    }

    #[test]
    fn a_paste_is_text_never_an_answer() {
        let mut input = Input::default();
        assert_eq!(on_paste(&mut input, "yes\nplease"), Action::None);
        assert_eq!(input.text(), "yes please");
        // A paste right after `a` takes the question back and is typed.
        let mut input = Input::default();
        on_key(&mut input, key(KeyCode::Char('a')), PENDING);
        assert_eq!(on_paste(&mut input, "a"), Action::ConfirmCancelled);
        assert_eq!(input.text(), "a");
    }

    #[test]
    fn esc_clears_a_draft_and_cancels_only_on_an_empty_line() {
        let running = KeyContext {
            turn_running: true,
            ..KeyContext::default()
        };
        let mut input = Input::default();
        typed(&mut input, "draft", running);
        assert_eq!(on_key(&mut input, key(KeyCode::Esc), running), Action::None);
        assert_eq!(input.text(), "");
        assert_eq!(
            on_key(&mut input, key(KeyCode::Esc), running),
            Action::Cancel
        );
        // Idle: nothing to cancel.
        assert_eq!(
            on_key(&mut input, key(KeyCode::Esc), KeyContext::default()),
            Action::None
        );
        // A selected tool is dropped before a turn is cancelled.
        let selected = KeyContext {
            tool_selected: true,
            ..running
        };
        assert_eq!(
            on_key(&mut input, key(KeyCode::Esc), selected),
            Action::Unselect
        );
        assert_eq!(on_key(&mut input, ctrl('c'), running), Action::Quit);
    }

    #[test]
    fn ctrl_n_p_and_to_pick_the_target() {
        let mut input = Input::default();
        typed(&mut input, "half", KeyContext::default());
        assert_eq!(
            on_key(&mut input, ctrl('n'), KeyContext::default()),
            Action::CycleTarget(true)
        );
        assert_eq!(
            on_key(&mut input, ctrl('p'), KeyContext::default()),
            Action::CycleTarget(false)
        );
        assert_eq!(input.text(), "half");
        assert_eq!(
            parse_line("/to bbbb1234"),
            Action::Target("bbbb1234".into())
        );
        assert_eq!(parse_line("/to"), Action::Target(String::new()));
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
