//! The built-in policies as Rust, so that `wfjail run -p default` does not parse TOML on every
//! run (the parser's cold code cost ~0.06 ms of a ~2.5 ms run; docs/benchmarks.md, "Issue 28,
//! fourth round"). `prebuilt_gen.rs` is generated from `policies/*.toml` by the test below,
//! which also fails when a policy file changed and the generated code did not:
//! `WFJAIL_REGENERATE=1 cargo test --lib prebuilt` writes it again.
//!
//! Only a built-in named on its own takes this path; a file that `extends` a built-in, and
//! every user file, are parsed as before (with their file:line errors).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::{
    At, ClockMode, Dur, EnvRules, FilesystemRules, Layer, Limits, Location, NamespaceRules,
    NetworkMode, NetworkRules, OnViolation, PathTemplate, Policy, ProcessRules, RandomMode,
    RandomRules, Size, SyscallRules, TimeRules, Toggle, ZygoteRules,
};

include!("prebuilt_gen.rs");

/// The notify-mode seccomp program of `policy` when it is a built-in exactly as shipped,
/// for a guest that is not a zygote and whose reads are not watched (`bpf::compile`'s
/// output for it, generated with it: compiling it cost ~0.06 ms of a one-shot run, most of
/// it cold code). `None` for anything else, which the caller compiles.
pub fn notify_program(
    policy: &Policy,
    zygote: bool,
    watch_reads: bool,
) -> Option<Vec<libc::sock_filter>> {
    if zygote || watch_reads {
        return None;
    }
    let program = notify_instructions(&policy.name)?;
    // Equal field for field, locations included: a built-in changed after loading (or a
    // policy merely named like one) is compiled.
    (get(&policy.name)? == *policy).then(|| {
        program
            .iter()
            .map(|&(code, jt, jf, k)| libc::sock_filter { code, jt, jf, k })
            .collect()
    })
}

fn at<T>(value: T, file: &str, line: usize, column: usize, field: Option<&str>) -> At<T> {
    At {
        value,
        at: Location {
            file: file.to_string(),
            line,
            column,
            field: field.map(str::to_string),
        },
    }
}

fn path(file: &str, p: &str, line: usize, column: usize, field: &str) -> At<PathTemplate> {
    at(PathTemplate(p.to_string()), file, line, column, Some(field))
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn string_map(items: &[(&str, &str)]) -> BTreeMap<String, String> {
    items
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt::Write;

    /// Rust source that builds the value.
    trait Emit {
        fn emit(&self) -> String;
    }

    impl Emit for String {
        fn emit(&self) -> String {
            format!("{self:?}.to_string()")
        }
    }
    impl Emit for bool {
        fn emit(&self) -> String {
            self.to_string()
        }
    }
    impl Emit for u64 {
        fn emit(&self) -> String {
            self.to_string()
        }
    }
    impl<T: Emit> Emit for Option<T> {
        fn emit(&self) -> String {
            match self {
                None => "None".to_string(),
                Some(v) => format!("Some({})", v.emit()),
            }
        }
    }
    macro_rules! unit_enum {
        ($($t:ident),*) => {$(
            impl Emit for $t {
                fn emit(&self) -> String {
                    format!("{}::{self:?}", stringify!($t))
                }
            }
        )*};
    }
    unit_enum!(
        Layer,
        OnViolation,
        Toggle,
        ClockMode,
        RandomMode,
        NetworkMode
    );
    impl Emit for Dur {
        fn emit(&self) -> String {
            format!("Dur(Duration::from_nanos({}))", self.0.as_nanos())
        }
    }
    impl Emit for Size {
        fn emit(&self) -> String {
            format!("Size({})", self.0)
        }
    }
    impl Emit for PathTemplate {
        fn emit(&self) -> String {
            format!("PathTemplate({:?}.to_string())", self.0)
        }
    }
    impl Emit for crate::policy::SyscallName {
        fn emit(&self) -> String {
            format!("super::SyscallName({:?}.to_string())", self.0)
        }
    }
    impl<T: Emit> Emit for At<T> {
        fn emit(&self) -> String {
            let Location {
                file,
                line,
                column,
                field,
            } = &self.at;
            format!(
                "at({}, {file:?}, {line}, {column}, {field:?})",
                self.value.emit()
            )
        }
    }
    impl<T: Emit> Emit for Vec<T> {
        fn emit(&self) -> String {
            let items: Vec<String> = self.iter().map(|v| format!("{},", v.emit())).collect();
            format!("vec![{}]", items.join(" "))
        }
    }

    /// The generated function that builds `p`.
    fn emit_policy(fn_name: &str, p: &Policy) -> String {
        let Policy {
            name,
            description,
            require,
            on_violation,
            filesystem,
            network,
            process,
            time,
            random,
            syscalls,
            limits,
            env,
            namespaces,
            zygote,
        } = p;
        let require: Vec<String> = require.iter().map(|l| format!("{},", l.emit())).collect();
        let keep: Vec<String> = env.keep.iter().map(|s| format!("{s:?},")).collect();
        let set: Vec<String> = env
            .set
            .iter()
            .map(|(k, v)| format!("({k:?}, {v:?}),"))
            .collect();
        let preload: Vec<String> = zygote.preload.iter().map(|s| format!("{s:?},")).collect();
        let paths = |v: &Vec<At<PathTemplate>>| {
            let items: Vec<String> = v
                .iter()
                .map(|r| {
                    let Location {
                        file,
                        line,
                        column,
                        field,
                    } = &r.at;
                    // Every path grant is located in a field.
                    let field = field.as_deref().expect("a path grant's field");
                    format!(
                        "path({file:?}, {:?}, {line}, {column}, {field:?}),",
                        r.value.0
                    )
                })
                .collect();
            format!("vec![{}]", items.join(" "))
        };
        let mut s = String::new();
        let _ = write!(
            s,
            "fn {fn_name}() -> Policy {{ let description = {}; Policy {{ \
             name: {}, description, \
             require: BTreeSet::from([{}]), \
             on_violation: {}, \
             filesystem: FilesystemRules {{ read: {}, write: {}, list: {} }}, \
             network: NetworkRules {{ mode: {} }}, \
             process: ProcessRules {{ threads: {}, subprocess: {}, exec: {}, address_randomization: {}, cpu_count: {} }}, \
             time: TimeRules {{ sleep: {}, clock: {} }}, \
             random: RandomRules {{ getrandom: {} }}, \
             syscalls: SyscallRules {{ allow: {}, deny: {} }}, \
             limits: Limits {{ timeout: {}, memory: {}, cpu: {}, session_cpu: {}, open_files: {}, output: {}, file_size: {}, processes: {}, disk: {} }}, \
             env: EnvRules {{ clear: {}, keep: strings(&[{}]), set: string_map(&[{}]) }}, \
             namespaces: NamespaceRules {{ user: {}, net: {}, pid: {}, ipc: {}, uts: {}, mount: {} }}, \
             zygote: ZygoteRules {{ reads_after_preload: {}, preload: strings(&[{}]) }} \
             }} }}",
            description.emit(),
            name.emit(),
            require.join(" "),
            on_violation.emit(),
            paths(&filesystem.read),
            paths(&filesystem.write),
            paths(&filesystem.list),
            network.mode.emit(),
            process.threads.emit(),
            process.subprocess.emit(),
            process.exec.emit(),
            process.address_randomization.emit(),
            process.cpu_count.emit(),
            time.sleep.emit(),
            time.clock.emit(),
            random.getrandom.emit(),
            syscalls.allow.emit(),
            syscalls.deny.emit(),
            limits.timeout.emit(),
            limits.memory.emit(),
            limits.cpu.emit(),
            limits.session_cpu.emit(),
            limits.open_files.emit(),
            limits.output.emit(),
            limits.file_size.emit(),
            limits.processes.emit(),
            limits.disk.emit(),
            env.clear.emit(),
            keep.join(" "),
            set.join(" "),
            namespaces.user.emit(),
            namespaces.net.emit(),
            namespaces.pid.emit(),
            namespaces.ipc.emit(),
            namespaces.uts.emit(),
            namespaces.mount.emit(),
            zygote.reads_after_preload.emit(),
            preload.join(" "),
        );
        s
    }

    /// `prebuilt_gen.rs` as the policy files make it today.
    fn generated() -> String {
        let mut out = String::from(
            "// Generated from policies/*.toml by src/policy/prebuilt.rs's test: do not edit.\n\
             // `WFJAIL_REGENERATE=1 cargo test --lib prebuilt` writes it again (then `cargo fmt`).\n\n\
             /// The built-in `name`, as `policy::load(name)` gives it.\n\
             pub(super) fn get(name: &str) -> Option<Policy> {\n    match name {\n",
        );
        for (name, _) in super::super::BUILTINS {
            let _ = writeln!(out, "        {name:?} => Some({}()),", fn_name(name));
        }
        out.push_str("        _ => None,\n    }\n}\n");
        out.push_str(
            "\n/// The notify-mode program of the built-in `name` (`notify_program`).\n\
             fn notify_instructions(name: &str) -> Option<&'static [(u16, u8, u8, u32)]> {\n    match name {\n",
        );
        for (name, _) in super::super::BUILTINS {
            let _ = writeln!(
                out,
                "        {name:?} => Some({}),",
                fn_name(name).to_uppercase() + "_NOTIFY"
            );
        }
        out.push_str("        _ => None,\n    }\n}\n");
        for (name, _) in super::super::BUILTINS {
            let p = super::super::load_parsed(name).expect("a built-in loads");
            out.push('\n');
            out.push_str(&emit_policy(&fn_name(name), &p));
            out.push('\n');
        }
        for (name, _) in super::super::BUILTINS {
            let p = super::super::load_parsed(name).expect("a built-in loads");
            let prog = program_of(&p);
            let _ = writeln!(
                out,
                "\n#[rustfmt::skip]\nconst {}: &[(u16, u8, u8, u32)] = &[",
                fn_name(name).to_uppercase() + "_NOTIFY"
            );
            for chunk in prog.chunks(6) {
                let items: Vec<String> = chunk
                    .iter()
                    .map(|i| format!("({:#x}, {}, {}, {:#x})", i.code, i.jt, i.jf, i.k))
                    .collect();
                let _ = writeln!(out, "    {},", items.join(", "));
            }
            out.push_str("];\n");
        }
        out
    }

    /// What a one-shot run compiles for `p`.
    fn program_of(p: &Policy) -> Vec<libc::sock_filter> {
        crate::policy::bpf::compile(p, crate::policy::bpf::Mode::Notify, None, false, false)
            .expect("a built-in compiles")
    }

    fn words(prog: &[libc::sock_filter]) -> Vec<(u16, u8, u8, u32)> {
        prog.iter().map(|i| (i.code, i.jt, i.jf, i.k)).collect()
    }

    fn fn_name(builtin: &str) -> String {
        format!("builtin_{}", builtin.replace('-', "_"))
    }

    /// Formats Rust source as `cargo fmt` would (the checked-in file is formatted).
    fn rustfmt(src: &str) -> String {
        use std::io::Write as _;
        let mut child = std::process::Command::new("rustfmt")
            .args(["--edition", "2024", "--emit", "stdout"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("rustfmt runs");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(src.as_bytes())
            .expect("rustfmt reads");
        let out = child.wait_with_output().expect("rustfmt ends");
        assert!(out.status.success(), "rustfmt failed");
        String::from_utf8(out.stdout).expect("utf-8")
    }

    #[test]
    fn prebuilt_policies_match_the_policy_files() {
        let file = concat!(env!("CARGO_MANIFEST_DIR"), "/src/policy/prebuilt_gen.rs");
        let want = rustfmt(&generated());
        if std::env::var_os("WFJAIL_REGENERATE").is_some() {
            std::fs::write(file, &want).expect("writing prebuilt_gen.rs");
        }
        let have = std::fs::read_to_string(file).unwrap_or_default();
        assert!(
            have == want,
            "src/policy/prebuilt_gen.rs is stale: run `WFJAIL_REGENERATE=1 cargo test --lib prebuilt`"
        );
        // And what it builds is what parsing gives, field for field.
        for (name, _) in super::super::BUILTINS {
            let parsed = super::super::load_parsed(name).expect("a built-in loads");
            let built = get(name).expect("every built-in is prebuilt");
            assert_eq!(format!("{built:#?}"), format!("{parsed:#?}"), "{name}");
            assert!(built == parsed, "{name}");
            // Its program is the compiler's; only for the shape it was compiled for.
            let prog = notify_program(&parsed, false, false).expect("prebuilt");
            assert_eq!(words(&prog), words(&program_of(&parsed)), "{name}");
            assert!(notify_program(&parsed, true, false).is_none());
            assert!(notify_program(&parsed, false, true).is_none());
        }
    }

    #[test]
    fn a_changed_builtin_is_not_prebuilt() {
        let mut p = super::super::load("default").expect("default loads");
        assert!(notify_program(&p, false, false).is_some());
        p.process.threads = Toggle::Allow;
        assert!(notify_program(&p, false, false).is_none());
        let mut p = super::super::load("default").expect("default loads");
        p.filesystem.read[0].at.line += 1;
        assert!(notify_program(&p, false, false).is_none());
        // A file's policy of the same content is named by its path.
        let p = super::super::from_source(
            "my.toml",
            &crate::policy::BUILTINS[0].1.replace("# default", "# mine"),
        )
        .expect("loads");
        assert!(notify_program(&p, false, false).is_none());
    }
}
