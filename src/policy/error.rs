//! Policy errors. Every error a user can cause names the file, line and column, the field and
//! what to do.

use std::fmt;
use std::ops::Range;

/// Where in which policy file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub file: String,
    pub line: usize,
    pub column: usize,
    /// The dotted field, e.g. `limits.timeout`, when it can be told.
    pub field: Option<String>,
}

impl Location {
    /// Resolves a byte span of `source` to line, column and the field it belongs to.
    pub fn of_span(file: &str, source: &str, span: Range<usize>) -> Self {
        let offset = span.start.min(source.len());
        let before = &source[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = source[line_start..offset].chars().count() + 1;
        Location {
            file: file.to_string(),
            line,
            column,
            field: field_at(source, offset),
        }
    }

    /// The first line of a file (for errors about the file as a whole).
    pub fn start_of(file: &str) -> Self {
        Location {
            file: file.to_string(),
            line: 1,
            column: 1,
            field: None,
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

/// The dotted name of the key whose value contains `offset`: the nearest `[table]` header
/// above it and the nearest `key =` at or above it inside that table.
fn field_at(source: &str, offset: usize) -> Option<String> {
    // Include the rest of the current line so that a key on this line is seen.
    let line_end = source[offset..]
        .find('\n')
        .map_or(source.len(), |i| offset + i);
    let upto = &source[..line_end];
    let mut key: Option<&str> = None;
    let mut table: Option<&str> = None;
    for line in upto.lines().rev() {
        let t = line.trim();
        if t.starts_with('[') {
            table = Some(t.trim_matches(|c| c == '[' || c == ']').trim());
            break;
        }
        if key.is_none()
            && let Some((k, _)) = t.split_once('=')
        {
            let k = k.trim();
            if !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-.\"".contains(c))
            {
                key = Some(k);
            }
        }
    }
    match (table, key) {
        (Some(t), Some(k)) => Some(format!("{t}.{k}")),
        (Some(t), None) => Some(format!("[{t}]")),
        (None, Some(k)) => Some(k.to_string()),
        (None, None) => None,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// Malformed TOML, unknown keys, wrong types, bad values: all found while parsing.
    #[error("{at}: {}{message}", field_prefix(.at))]
    Invalid { at: Location, message: String },

    /// A policy file (given on the command line) that does not exist or cannot be read.
    #[error("{file}: {source}; a policy is a built-in name ({builtins}) or a path to a .toml file")]
    Unreadable {
        file: String,
        builtins: String,
        source: std::io::Error,
    },

    /// An unknown built-in name (no path separator, no .toml extension).
    #[error(
        "unknown policy {name:?}: built-ins are {builtins}; a path to a file needs a '/' or '.toml'{hint}"
    )]
    UnknownBuiltin {
        name: String,
        builtins: String,
        hint: String,
    },

    /// `extends` forms a cycle.
    #[error("{at}: extends: cycle {chain}; remove one of these `extends`")]
    Cycle { at: Location, chain: String },

    /// `extends` chains are bounded.
    #[error("{at}: extends: more than {max} levels of `extends`; flatten the chain")]
    TooDeep { at: Location, max: usize },
}

fn field_prefix(at: &Location) -> String {
    match &at.field {
        Some(f) => format!("{f}: "),
        None => String::new(),
    }
}

impl PolicyError {
    /// Where the error is, when it is in a file: `(file, line, column, field)`.
    pub fn location(&self) -> Option<&Location> {
        match self {
            PolicyError::Invalid { at, .. }
            | PolicyError::Cycle { at, .. }
            | PolicyError::TooDeep { at, .. } => Some(at),
            _ => None,
        }
    }

    /// Builds an `Invalid` error from a `toml` parse error, keeping its span.
    pub fn from_toml(file: &str, source: &str, err: &toml::de::Error) -> Self {
        let at = match err.span() {
            Some(span) => Location::of_span(file, source, span),
            None => Location::start_of(file),
        };
        let mut message = err.message().trim_end().to_string();
        if let Some(sugg) = unknown_field_suggestion(&message) {
            message.push_str(&sugg);
        }
        PolicyError::Invalid { at, message }
    }
}

/// For toml's "unknown field `x`, expected one of `a`, `b`": the closest expected name.
fn unknown_field_suggestion(message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown field `")?;
    let (wrong, rest) = rest.split_once('`')?;
    let expected: Vec<&str> = rest.split('`').skip(1).step_by(2).collect();
    let best = expected
        .iter()
        .map(|e| (strsim::jaro_winkler(wrong, e), *e))
        .filter(|(s, _)| *s > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))?;
    Some(format!("; did you mean `{}`?", best.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locates_lines_and_fields() {
        let src = "extends = \"default\"\n\n[limits]\ntimeout = \"30 sec\"\n";
        let off = src.find("\"30 sec\"").unwrap();
        let at = Location::of_span("p.toml", src, off..off + 8);
        assert_eq!((at.line, at.column), (4, 11));
        assert_eq!(at.field.as_deref(), Some("limits.timeout"));
        let multi = "[syscalls]\nallow = [\n  \"read\",\n  \"nope\",\n]\n";
        let off = multi.find("\"nope\"").unwrap();
        assert_eq!(
            Location::of_span("p", multi, off..off).field.as_deref(),
            Some("syscalls.allow")
        );
    }

    #[test]
    fn suggests_fields() {
        let m = "unknown field `timout`, expected one of `timeout`, `memory`";
        assert_eq!(
            unknown_field_suggestion(m).unwrap(),
            "; did you mean `timeout`?"
        );
    }
}
