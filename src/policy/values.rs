//! Typed policy values parsed from strings: durations, sizes, path templates and syscall names.
//!
//! Durations and sizes validate in their `Deserialize` impls, so that `toml` attaches the line
//! and column of the offending value; paths and syscall names are parsed per array element by
//! `policy::apply`, so that an error points at the element.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::syscalls;

/// A duration written `500ms`, `30s`, `2m` or `1h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl Dur {
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let split = s
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let value: f64 = num.parse().map_err(|_| bad_duration(s))?;
        let secs = match unit.trim() {
            "ms" => value / 1000.0,
            "s" => value,
            "m" | "min" => value * 60.0,
            "h" => value * 3600.0,
            _ => return Err(bad_duration(s)),
        };
        if !secs.is_finite() || !(0.001..=7.0 * 86400.0).contains(&secs) {
            return Err(format!(
                "duration {s:?} is out of range: use something between 1ms and 7 days"
            ));
        }
        Ok(Dur(Duration::from_secs_f64(secs)))
    }
}

fn bad_duration(s: &str) -> String {
    format!("invalid duration {s:?}: write a number and a unit, like \"500ms\", \"30s\" or \"2m\"")
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms.is_multiple_of(60_000) {
            write!(f, "{}m", ms / 60_000)
        } else if ms.is_multiple_of(1000) {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Dur::parse(&s).map_err(serde::de::Error::custom)
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A size in bytes, written `512MiB`, `16MiB`, `4KiB`, `1GiB` or a plain byte count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl Size {
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let value: u64 = num.parse().map_err(|_| bad_size(s))?;
        let mult: u64 = match unit.trim() {
            "" | "B" => 1,
            "KiB" | "K" | "k" => 1 << 10,
            "MiB" | "M" => 1 << 20,
            "GiB" | "G" => 1 << 30,
            "TiB" | "T" => 1 << 40,
            _ => return Err(bad_size(s)),
        };
        value
            .checked_mul(mult)
            .map(Size)
            .ok_or_else(|| format!("size {s:?} is too large"))
    }
}

fn bad_size(s: &str) -> String {
    format!("invalid size {s:?}: write a number and a unit, like \"512MiB\", \"16MiB\" or \"1GiB\"")
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
            if b >= 1 << shift && b.is_multiple_of(1 << shift) {
                return write!(f, "{}{unit}", b >> shift);
            }
        }
        write!(f, "{b}")
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Str(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(Size(n)),
            Raw::Str(s) => Size::parse(&s).map_err(serde::de::Error::custom),
        }
    }
}

impl Serialize for Size {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The variables a path may use.
pub const VARIABLES: &[&str] = &["cwd", "home", "exe_dir"];

/// Values for the path variables of one run.
#[derive(Debug, Clone, Default)]
pub struct VarContext {
    pub cwd: Option<String>,
    pub home: Option<String>,
    pub exe_dir: Option<String>,
    /// More values `${exe_dir}` stands for, each giving the grant again: the directory of the
    /// command with its symlinks followed, and a virtualenv's base interpreter directory
    /// (`home` in its `pyvenv.cfg`), so that a venv's `bin/..` and its base prefix are both
    /// granted.
    pub exe_dir_also: Vec<String>,
}

/// A filesystem path that may contain `${cwd}`, `${home}` or `${exe_dir}`. Syntax and variable
/// names are checked when the policy is read; values are substituted when a run is planned.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PathTemplate(pub String);

impl PathTemplate {
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.is_empty() {
            return Err("empty path: write an absolute path such as \"/usr\"".into());
        }
        let mut rest = s;
        while let Some(i) = rest.find('$') {
            let after = &rest[i + 1..];
            let Some(body) = after.strip_prefix('{') else {
                return Err(format!(
                    "path {s:?}: write variables as ${{name}}; known: {}",
                    var_list()
                ));
            };
            let Some(end) = body.find('}') else {
                return Err(format!("path {s:?}: unclosed ${{"));
            };
            let name = &body[..end];
            if !VARIABLES.contains(&name) {
                return Err(format!(
                    "path {s:?}: unknown variable ${{{name}}}; known: {}",
                    var_list()
                ));
            }
            rest = &body[end + 1..];
        }
        if !s.starts_with('/') && !s.starts_with("${") {
            return Err(format!(
                "path {s:?} is relative: write an absolute path or start with ${{cwd}}"
            ));
        }
        Ok(PathTemplate(s.to_string()))
    }

    /// Substitutes the variables; the error names the variable that has no value.
    pub fn expand(&self, ctx: &VarContext) -> Result<String, String> {
        let mut out = self.0.clone();
        for (name, value) in [
            ("cwd", &ctx.cwd),
            ("home", &ctx.home),
            ("exe_dir", &ctx.exe_dir),
        ] {
            let pat = format!("${{{name}}}");
            if out.contains(&pat) {
                let v = value.as_ref().ok_or_else(|| {
                    format!("${{{name}}} has no value here (used in {:?})", self.0)
                })?;
                out = out.replace(&pat, v);
            }
        }
        Ok(out)
    }
}

fn var_list() -> String {
    VARIABLES
        .iter()
        .map(|v| format!("${{{v}}}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Serialize for PathTemplate {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// A syscall name checked against the x86_64 table; an unknown name is rejected with the
/// closest valid names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SyscallName(pub String);

impl SyscallName {
    pub fn parse(s: &str) -> Result<Self, String> {
        if syscalls::number(s).is_some() {
            return Ok(SyscallName(s.to_string()));
        }
        let near = syscalls::closest(s, 3);
        if near.is_empty() {
            Err(format!(
                "unknown syscall {s:?}: not in the x86_64 syscall table"
            ))
        } else {
            Err(format!(
                "unknown syscall {s:?}: did you mean {}?",
                near.join(", ")
            ))
        }
    }
}

impl Serialize for SyscallName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(Dur::parse("500ms").unwrap().0, Duration::from_millis(500));
        assert_eq!(Dur::parse("30s").unwrap().0, Duration::from_secs(30));
        assert_eq!(Dur::parse("2m").unwrap().0, Duration::from_secs(120));
        assert_eq!(Dur::parse("1.5s").unwrap().0, Duration::from_millis(1500));
        assert!(Dur::parse("30").unwrap_err().contains("\"30s\""));
        assert!(Dur::parse("0s").is_err());
        assert!(Dur::parse("ten seconds").is_err());
        assert_eq!(Dur::parse("2m").unwrap().to_string(), "2m");
        assert_eq!(Dur::parse("1500ms").unwrap().to_string(), "1500ms");
    }

    #[test]
    fn sizes() {
        assert_eq!(Size::parse("512MiB").unwrap().0, 512 << 20);
        assert_eq!(Size::parse("4096").unwrap().0, 4096);
        assert!(Size::parse("12 parsecs").is_err());
        assert_eq!(Size::parse("16MiB").unwrap().to_string(), "16MiB");
    }

    #[test]
    fn paths() {
        assert!(PathTemplate::parse("/usr").is_ok());
        assert!(PathTemplate::parse("${exe_dir}/..").is_ok());
        assert!(
            PathTemplate::parse("${nope}/x")
                .unwrap_err()
                .contains("unknown variable")
        );
        assert!(
            PathTemplate::parse("usr/lib")
                .unwrap_err()
                .contains("relative")
        );
        let ctx = VarContext {
            cwd: Some("/w".into()),
            ..Default::default()
        };
        assert_eq!(
            PathTemplate::parse("${cwd}/a")
                .unwrap()
                .expand(&ctx)
                .unwrap(),
            "/w/a"
        );
        assert!(
            PathTemplate::parse("${home}")
                .unwrap()
                .expand(&ctx)
                .is_err()
        );
    }

    #[test]
    fn syscall_names() {
        assert!(SyscallName::parse("openat").is_ok());
        let e = SyscallName::parse("opneat").unwrap_err();
        assert!(e.contains("openat"), "{e}");
    }
}
