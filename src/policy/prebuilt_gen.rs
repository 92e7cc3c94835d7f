// Generated from policies/*.toml by src/policy/prebuilt.rs's test: do not edit.
// `WFJAIL_REGENERATE=1 cargo test --lib prebuilt` writes it again (then `cargo fmt`).

/// The built-in `name`, as `policy::load(name)` gives it.
pub(super) fn get(name: &str) -> Option<Policy> {
    match name {
        "default" => Some(builtin_default()),
        "strict" => Some(builtin_strict()),
        "temporal-python" => Some(builtin_temporal_python()),
        "permissive" => Some(builtin_permissive()),
        _ => None,
    }
}

fn builtin_default() -> Policy {
    let description = "Baseline for workflow code: no network, threads, subprocesses or exec; system libraries readable".to_string();
    Policy {
        name: "default".to_string(),
        description,
        require: BTreeSet::from([Layer::Landlock, Layer::Seccomp]),
        on_violation: OnViolation::Deny,
        filesystem: FilesystemRules {
            read: vec![
                path("builtin:default", "/usr", 12, 5, "filesystem.read"),
                path("builtin:default", "/lib", 13, 5, "filesystem.read"),
                path("builtin:default", "/lib64", 14, 5, "filesystem.read"),
                path("builtin:default", "/bin", 15, 5, "filesystem.read"),
                path(
                    "builtin:default",
                    "/etc/ld.so.cache",
                    16,
                    5,
                    "filesystem.read",
                ),
                path(
                    "builtin:default",
                    "/etc/localtime",
                    17,
                    5,
                    "filesystem.read",
                ),
                path("builtin:default", "/dev/zero", 18, 5, "filesystem.read"),
                path("builtin:default", "/dev/urandom", 19, 5, "filesystem.read"),
            ],
            write: vec![path(
                "builtin:default",
                "/dev/null",
                22,
                5,
                "filesystem.write",
            )],
            list: vec![],
        },
        network: NetworkRules {
            mode: NetworkMode::None,
        },
        process: ProcessRules {
            threads: Toggle::Deny,
            subprocess: Toggle::Deny,
            exec: Toggle::Deny,
            address_randomization: Toggle::Allow,
            cpu_count: None,
        },
        time: TimeRules {
            sleep: Toggle::Allow,
            clock: ClockMode::Real,
        },
        random: RandomRules {
            getrandom: RandomMode::Allow,
        },
        syscalls: SyscallRules {
            allow: vec![],
            deny: vec![],
        },
        limits: Limits {
            timeout: Some(Dur(Duration::from_nanos(30000000000))),
            memory: Some(Size(1073741824)),
            cpu: Some(Dur(Duration::from_nanos(30000000000))),
            session_cpu: None,
            open_files: Some(at(
                256,
                "builtin:default",
                47,
                14,
                Some("limits.open_files"),
            )),
            output: Size(16777216),
            file_size: Some(Size(67108864)),
            processes: Some(1),
            disk: None,
        },
        env: EnvRules {
            clear: true,
            keep: strings(&["PATH", "LANG", "LC_ALL"]),
            set: string_map(&[
                ("HOME", "/nonexistent"),
                ("PYTHONDONTWRITEBYTECODE", "1"),
                ("PYTHONHASHSEED", "0"),
                ("TZ", "UTC"),
            ]),
        },
        namespaces: NamespaceRules {
            user: true,
            net: true,
            pid: true,
            ipc: true,
            uts: true,
            mount: true,
        },
        zygote: ZygoteRules {
            reads_after_preload: Toggle::Allow,
            preload: strings(&[]),
        },
    }
}

fn builtin_strict() -> Policy {
    let description =
        "Determinism first: no sleep, no randomness, nothing readable beyond the interpreter"
            .to_string();
    Policy {
        name: "strict".to_string(),
        description,
        require: BTreeSet::from([Layer::Landlock, Layer::Seccomp]),
        on_violation: OnViolation::Deny,
        filesystem: FilesystemRules {
            read: vec![
                path("builtin:strict", "${exe_dir}/..", 9, 5, "filesystem.read"),
                path(
                    "builtin:strict",
                    "/lib/x86_64-linux-gnu",
                    10,
                    5,
                    "filesystem.read",
                ),
                path(
                    "builtin:strict",
                    "/usr/lib/x86_64-linux-gnu",
                    11,
                    5,
                    "filesystem.read",
                ),
                path(
                    "builtin:strict",
                    "/lib64/ld-linux-x86-64.so.2",
                    12,
                    5,
                    "filesystem.read",
                ),
                path(
                    "builtin:strict",
                    "/etc/ld.so.cache",
                    13,
                    5,
                    "filesystem.read",
                ),
            ],
            write: vec![path(
                "builtin:strict",
                "/dev/null",
                15,
                10,
                "filesystem.write",
            )],
            list: vec![],
        },
        network: NetworkRules {
            mode: NetworkMode::None,
        },
        process: ProcessRules {
            threads: Toggle::Deny,
            subprocess: Toggle::Deny,
            exec: Toggle::Deny,
            address_randomization: Toggle::Allow,
            cpu_count: None,
        },
        time: TimeRules {
            sleep: Toggle::Deny,
            clock: ClockMode::Real,
        },
        random: RandomRules {
            getrandom: RandomMode::Deny,
        },
        syscalls: SyscallRules {
            allow: vec![],
            deny: vec![],
        },
        limits: Limits {
            timeout: Some(Dur(Duration::from_nanos(30000000000))),
            memory: Some(Size(1073741824)),
            cpu: Some(Dur(Duration::from_nanos(30000000000))),
            session_cpu: None,
            open_files: Some(at(256, "builtin:strict", 36, 14, Some("limits.open_files"))),
            output: Size(16777216),
            file_size: Some(Size(67108864)),
            processes: Some(1),
            disk: None,
        },
        env: EnvRules {
            clear: true,
            keep: strings(&["LANG", "LC_ALL"]),
            set: string_map(&[
                ("HOME", "/nonexistent"),
                ("PYTHONDONTWRITEBYTECODE", "1"),
                ("PYTHONHASHSEED", "0"),
                ("TZ", "UTC"),
            ]),
        },
        namespaces: NamespaceRules {
            user: true,
            net: true,
            pid: true,
            ipc: true,
            uts: true,
            mount: true,
        },
        zygote: ZygoteRules {
            reads_after_preload: Toggle::Allow,
            preload: strings(&[]),
        },
    }
}

fn builtin_temporal_python() -> Policy {
    let description = "Temporal Python workflow code: the interpreter prefix readable, no blocking sleep, workflow time and seeded randomness".to_string();
    Policy {
        name: "temporal-python".to_string(),
        description,
        require: BTreeSet::from([Layer::Landlock, Layer::Seccomp]),
        on_violation: OnViolation::Deny,
        filesystem: FilesystemRules {
            read: vec![
                path("builtin:default", "/usr", 12, 5, "filesystem.read"),
                path("builtin:default", "/lib", 13, 5, "filesystem.read"),
                path("builtin:default", "/lib64", 14, 5, "filesystem.read"),
                path("builtin:default", "/bin", 15, 5, "filesystem.read"),
                path(
                    "builtin:default",
                    "/etc/ld.so.cache",
                    16,
                    5,
                    "filesystem.read",
                ),
                path(
                    "builtin:default",
                    "/etc/localtime",
                    17,
                    5,
                    "filesystem.read",
                ),
                path("builtin:default", "/dev/zero", 18, 5, "filesystem.read"),
                path(
                    "builtin:temporal-python",
                    "${exe_dir}/..",
                    10,
                    5,
                    "filesystem.read",
                ),
                path(
                    "builtin:temporal-python",
                    "${cwd}",
                    11,
                    5,
                    "filesystem.read",
                ),
            ],
            write: vec![path(
                "builtin:default",
                "/dev/null",
                22,
                5,
                "filesystem.write",
            )],
            list: vec![],
        },
        network: NetworkRules {
            mode: NetworkMode::None,
        },
        process: ProcessRules {
            threads: Toggle::Deny,
            subprocess: Toggle::Deny,
            exec: Toggle::Deny,
            address_randomization: Toggle::Deny,
            cpu_count: Some(at(
                1,
                "builtin:temporal-python",
                17,
                13,
                Some("process.cpu_count"),
            )),
        },
        time: TimeRules {
            sleep: Toggle::Deny,
            clock: ClockMode::Virtual,
        },
        random: RandomRules {
            getrandom: RandomMode::Seeded,
        },
        syscalls: SyscallRules {
            allow: vec![],
            deny: vec![],
        },
        limits: Limits {
            timeout: Some(Dur(Duration::from_nanos(30000000000))),
            memory: Some(Size(1073741824)),
            cpu: Some(Dur(Duration::from_nanos(30000000000))),
            session_cpu: None,
            open_files: Some(at(
                256,
                "builtin:default",
                47,
                14,
                Some("limits.open_files"),
            )),
            output: Size(16777216),
            file_size: Some(Size(67108864)),
            processes: Some(1),
            disk: None,
        },
        env: EnvRules {
            clear: true,
            keep: strings(&["PATH", "LANG", "LC_ALL"]),
            set: string_map(&[
                ("HOME", "/nonexistent"),
                ("PYTHONDONTWRITEBYTECODE", "1"),
                ("PYTHONHASHSEED", "0"),
                ("TZ", "UTC"),
            ]),
        },
        namespaces: NamespaceRules {
            user: true,
            net: true,
            pid: true,
            ipc: true,
            uts: true,
            mount: true,
        },
        zygote: ZygoteRules {
            reads_after_preload: Toggle::Allow,
            preload: strings(&[]),
        },
    }
}

fn builtin_permissive() -> Policy {
    let description = "Learning mode: everything allowed and reported, nothing denied".to_string();
    Policy {
        name: "permissive".to_string(),
        description,
        require: BTreeSet::from([Layer::Seccomp]),
        on_violation: OnViolation::Warn,
        filesystem: FilesystemRules {
            read: vec![
                path("builtin:permissive", "/usr", 15, 5, "filesystem.read"),
                path("builtin:permissive", "/lib", 16, 5, "filesystem.read"),
                path("builtin:permissive", "/lib64", 17, 5, "filesystem.read"),
                path("builtin:permissive", "/bin", 18, 5, "filesystem.read"),
                path(
                    "builtin:permissive",
                    "/etc/ld.so.cache",
                    19,
                    5,
                    "filesystem.read",
                ),
                path(
                    "builtin:permissive",
                    "/etc/localtime",
                    20,
                    5,
                    "filesystem.read",
                ),
                path("builtin:permissive", "/dev/zero", 21, 5, "filesystem.read"),
                path(
                    "builtin:permissive",
                    "/dev/urandom",
                    22,
                    5,
                    "filesystem.read",
                ),
                path(
                    "builtin:permissive",
                    "${exe_dir}/..",
                    23,
                    5,
                    "filesystem.read",
                ),
                path("builtin:permissive", "${cwd}", 24, 5, "filesystem.read"),
            ],
            write: vec![path(
                "builtin:permissive",
                "/dev/null",
                26,
                10,
                "filesystem.write",
            )],
            list: vec![],
        },
        network: NetworkRules {
            mode: NetworkMode::None,
        },
        process: ProcessRules {
            threads: Toggle::Deny,
            subprocess: Toggle::Deny,
            exec: Toggle::Deny,
            address_randomization: Toggle::Allow,
            cpu_count: None,
        },
        time: TimeRules {
            sleep: Toggle::Deny,
            clock: ClockMode::Real,
        },
        random: RandomRules {
            getrandom: RandomMode::Deny,
        },
        syscalls: SyscallRules {
            allow: vec![],
            deny: vec![],
        },
        limits: Limits {
            timeout: Some(Dur(Duration::from_nanos(300000000000))),
            memory: None,
            cpu: None,
            session_cpu: None,
            open_files: Some(at(
                1024,
                "builtin:permissive",
                40,
                14,
                Some("limits.open_files"),
            )),
            output: Size(67108864),
            file_size: None,
            processes: None,
            disk: None,
        },
        env: EnvRules {
            clear: false,
            keep: strings(&[]),
            set: string_map(&[]),
        },
        namespaces: NamespaceRules {
            user: true,
            net: false,
            pid: true,
            ipc: true,
            uts: true,
            mount: true,
        },
        zygote: ZygoteRules {
            reads_after_preload: Toggle::Allow,
            preload: strings(&[]),
        },
    }
}
