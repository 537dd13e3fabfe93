//! How values show in text meant for people: [`shown`] for a candidate id
//! in `status`, `list` and `transfer`, and [`TextFields`] for the log.
//!
//! The fields of a text log line, `name=value`, each value quoted (with
//! Rust's escapes) unless it is plain: a value that holds whitespace, `=`,
//! a quote, a backslash or a character that does not show as itself (a
//! control, a zero-width or a direction-changing character) is quoted, so
//! that a candidate id such as `a token=9 election=prod` cannot pass for
//! other fields. Strings were always quoted; the message is written as it
//! is.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::{MakeVisitor, VisitFmt, VisitOutput};
use tracing_subscriber::fmt::format::Writer;

/// The [`tracing_subscriber::fmt::FormatFields`] of the text log.
#[derive(Debug, Default, Clone, Copy)]
pub struct TextFields;

impl<'a> MakeVisitor<Writer<'a>> for TextFields {
    type Visitor = TextVisitor<'a>;

    fn make_visitor(&self, writer: Writer<'a>) -> Self::Visitor {
        TextVisitor {
            writer,
            first: true,
            result: Ok(()),
        }
    }
}

pub struct TextVisitor<'a> {
    writer: Writer<'a>,
    first: bool,
    result: fmt::Result,
}

impl TextVisitor<'_> {
    fn write(&mut self, field: &Field, value: &str, quote: bool) {
        // What the `log` crate's records carry besides their message (the
        // default formatter leaves them out too).
        if self.result.is_err() || field.name().starts_with("log.") {
            return;
        }
        let space = if self.first { "" } else { " " };
        self.first = false;
        self.result = match (field.name(), quote) {
            ("message", _) => write!(self.writer, "{space}{value}"),
            (name, true) => write!(self.writer, "{space}{name}={value:?}"),
            (name, false) => write!(self.writer, "{space}{name}={value}"),
        };
    }
}

impl Visit for TextVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.write(field, value, true);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name().starts_with("log.") {
            return;
        }
        let mut text = String::new();
        if write!(text, "{value:?}").is_err() {
            self.result = Err(fmt::Error);
            return;
        }
        let quote = !plain(&text);
        self.write(field, &text, quote);
    }
}

impl VisitOutput<fmt::Result> for TextVisitor<'_> {
    fn finish(self) -> fmt::Result {
        self.result
    }
}

impl VisitFmt for TextVisitor<'_> {
    fn writer(&mut self) -> &mut dyn fmt::Write {
        &mut self.writer
    }
}

/// A value (a candidate id) as the human output of `status`, `list` and
/// `transfer` shows it: as it is when plain and free of the separators
/// those lines use (`,` `;` `(` `)`), and not `-` (no leader, in `list`);
/// else quoted with Rust's escapes, so that it cannot pass for more of the
/// line.
pub fn shown(value: &str) -> std::borrow::Cow<'_, str> {
    let separators = [',', ';', '(', ')'];
    if plain(value) && value != "-" && !value.contains(separators) {
        std::borrow::Cow::Borrowed(value)
    } else {
        std::borrow::Cow::Owned(format!("{value:?}"))
    }
}

/// Whether `text` shows as itself in a `name=value` field: not empty, and
/// nothing in it that Rust's escapes would change, nor whitespace or `=`.
fn plain(text: &str) -> bool {
    !text.is_empty()
        && text
            .chars()
            .all(|c| !c.is_whitespace() && c != '=' && c.escape_debug().len() == 1)
}

#[cfg(test)]
mod tests {
    use super::plain;

    #[test]
    fn ids_that_could_pass_for_more_of_a_line_are_shown_quoted() {
        assert_eq!(super::shown("web-2"), "web-2");
        for id in ["w3, w4 (priority 9)", "a;b", "-", "a b", "x\u{202e}y"] {
            assert_eq!(super::shown(id), format!("{id:?}"));
        }
    }

    #[test]
    fn only_values_that_show_as_themselves_are_plain() {
        for value in ["web-2", "12", "/tmp/x.db", "a:b", "é", "lease 3s"] {
            assert_eq!(plain(value), !value.contains(' '), "{value}");
        }
        for value in [
            "",
            "a token=9",
            "a=b",
            "\"x\"",
            "a\\b",
            "a\u{202e}b",
            "a\u{200b}b",
            "a\tb",
            " ",
        ] {
            assert!(!plain(value), "{value:?}");
        }
    }
}
