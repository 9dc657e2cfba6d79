//! The stand-in shell of a simulated container: what `kubectl exec`, `kubectl cp` and a
//! browser terminal run. Nothing runs for real in the simulator; each container has a small
//! file tree and its pod's environment, and these few commands act on them as a busybox
//! shell would: `echo`, `env`/`printenv`, `hostname`, `pwd`, `stty size`, `cat`, `ls`, `test`, `mkdir`,
//! `true`/`false`, `exit`, `tar` (what `kubectl cp` runs) and `sh -c`.

use std::collections::{BTreeMap, BTreeSet};

mod tar;

/// A container's files: absolute paths to contents, and the directories there are.
#[derive(Debug, Clone)]
pub(crate) struct Files {
    files: BTreeMap<String, Vec<u8>>,
    dirs: BTreeSet<String>,
}

impl Files {
    /// What a new container holds.
    pub(crate) fn new(pod: &str) -> Self {
        let mut files = Files {
            files: BTreeMap::new(),
            dirs: ["/", "/tmp", "/etc", "/app"]
                .into_iter()
                .map(str::to_owned)
                .collect(),
        };
        files.write("/etc/hostname", format!("{pod}\n").into_bytes());
        files.write(
            "/etc/os-release",
            b"NAME=\"Drover stand-in\"\nPRETTY_NAME=\"Drover simulated container (a stand-in shell)\"\n"
                .to_vec(),
        );
        files.write(
            "/app/README",
            b"This container is simulated: nothing runs in it.\n".to_vec(),
        );
        files
    }

    fn write(&mut self, path: &str, contents: Vec<u8>) {
        let mut parent = parent(path);
        while parent != "/" {
            self.dirs.insert(parent.clone());
            parent = self::parent(&parent);
        }
        self.files.insert(path.to_owned(), contents);
    }

    fn is_dir(&self, path: &str) -> bool {
        self.dirs.contains(path)
    }

    /// The entries right under a directory, directories with a trailing slash.
    fn children(&self, dir: &str) -> Vec<String> {
        let prefix = if dir == "/" {
            "/".to_owned()
        } else {
            format!("{dir}/")
        };
        let direct = |p: &String| {
            p.strip_prefix(&prefix)
                .filter(|rest| !rest.is_empty() && !rest.contains('/'))
                .map(str::to_owned)
        };
        let mut names: Vec<String> = self
            .dirs
            .iter()
            .filter_map(direct)
            .map(|d| format!("{d}/"))
            .chain(self.files.keys().filter_map(direct))
            .collect();
        names.sort();
        names
    }
}

/// Where a command runs: its container's files and environment.
#[derive(Debug)]
pub(crate) struct Context<'a> {
    pub(crate) files: &'a mut Files,
    pub(crate) env: &'a [(String, String)],
    /// The terminal's size (columns, rows), when the session has a terminal that told it.
    pub(crate) size: Option<(u16, u16)>,
}

/// What a command printed and how it ended.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
    pub(crate) code: i32,
    /// `exit` was run: an interactive shell ends.
    pub(crate) exited: bool,
}

impl Outcome {
    fn out(text: impl Into<Vec<u8>>) -> Self {
        Outcome {
            stdout: text.into(),
            ..Outcome::default()
        }
    }

    fn fail(code: i32, message: impl AsRef<str>) -> Self {
        Outcome {
            stderr: format!("{}\n", message.as_ref()).into_bytes(),
            code,
            ..Outcome::default()
        }
    }
}

/// Whether `argv` reads its standard input to the end before it can answer (so the session
/// gathers stdin first), as opposed to an interactive shell, which reads it line by line.
pub(crate) fn reads_stdin(argv: &[String]) -> bool {
    match argv.first().map(|a| program(a)) {
        Some("cat") => argv.len() == 1,
        Some("tar") => argv.get(1).is_some_and(|mode| mode.contains('x')),
        _ => false,
    }
}

/// Whether `argv` is a shell with no command: it reads commands from stdin, one a line.
pub(crate) fn is_interactive(argv: &[String]) -> bool {
    argv.len() == 1 && matches!(program(&argv[0]), "sh" | "bash" | "ash")
}

fn program(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Runs one command (a program and its arguments, as exec names them) with `stdin` given.
pub(crate) fn run(argv: &[String], stdin: &[u8], cx: &mut Context<'_>) -> Outcome {
    let Some(name) = argv.first() else {
        return Outcome::fail(126, "no command given");
    };
    let args = &argv[1..];
    match program(name) {
        "echo" => {
            let (newline, words) = match args.first().map(String::as_str) {
                Some("-n") => (false, &args[1..]),
                _ => (true, args),
            };
            let mut text = words.join(" ");
            if newline {
                text.push('\n');
            }
            Outcome::out(text)
        }
        "env" | "printenv" if args.is_empty() => Outcome::out(
            cx.env
                .iter()
                .map(|(k, v)| format!("{k}={v}\n"))
                .collect::<String>(),
        ),
        "printenv" => {
            let found: Vec<String> = args
                .iter()
                .filter_map(|a| cx.env.iter().find(|(k, _)| k == a))
                .map(|(_, v)| format!("{v}\n"))
                .collect();
            let code = i32::from(found.len() != args.len());
            Outcome {
                code,
                ..Outcome::out(found.concat())
            }
        }
        "hostname" => Outcome::out(
            cx.files
                .files
                .get("/etc/hostname")
                .cloned()
                .unwrap_or_default(),
        ),
        "pwd" => Outcome::out("/\n"),
        // What a program sizing its output to the terminal reads: rows, then columns.
        "stty" if args.first().map(String::as_str) == Some("size") => match cx.size {
            Some((columns, rows)) => Outcome::out(format!("{rows} {columns}\n")),
            None => Outcome::fail(1, "stty: standard input: Not a tty"),
        },
        "true" => Outcome::default(),
        "false" => Outcome {
            code: 1,
            ..Outcome::default()
        },
        "exit" => Outcome {
            code: args.first().and_then(|c| c.parse().ok()).unwrap_or(0),
            exited: true,
            ..Outcome::default()
        },
        "cat" if args.is_empty() => Outcome::out(stdin.to_vec()),
        "cat" => {
            let mut outcome = Outcome::default();
            for path in args {
                let path = absolute(path);
                match cx.files.files.get(&path) {
                    Some(contents) => outcome.stdout.extend_from_slice(contents),
                    None if cx.files.is_dir(&path) => {
                        outcome
                            .stderr
                            .extend(b"cat: read error: Is a directory\n".iter().copied());
                        outcome.code = 1;
                    }
                    None => {
                        outcome.stderr.extend(
                            format!("cat: can't open '{path}': No such file or directory\n")
                                .bytes(),
                        );
                        outcome.code = 1;
                    }
                }
            }
            outcome
        }
        "ls" => ls(args, cx.files),
        "mkdir" => {
            for path in args.iter().filter(|a| !a.starts_with('-')) {
                let path = absolute(path);
                let mut dir = path.clone();
                while dir != "/" {
                    cx.files.dirs.insert(dir.clone());
                    dir = parent(&dir);
                }
            }
            Outcome::default()
        }
        "test" | "[" => {
            let args: Vec<&str> = args
                .iter()
                .map(String::as_str)
                .filter(|a| *a != "]")
                .collect();
            let holds = match args.as_slice() {
                ["-d", path] => cx.files.is_dir(&absolute(path)),
                ["-f", path] => cx.files.files.contains_key(&absolute(path)),
                ["-e", path] => {
                    let path = absolute(path);
                    cx.files.is_dir(&path) || cx.files.files.contains_key(&path)
                }
                [word] => !word.is_empty(),
                [a, "=", b] => a == b,
                [a, "!=", b] => a != b,
                _ => false,
            };
            Outcome {
                code: i32::from(!holds),
                ..Outcome::default()
            }
        }
        "tar" => tar::run(args, stdin, cx.files),
        "sh" | "bash" | "ash" => match args {
            [flag, script, ..] if flag == "-c" => script_run(script, stdin, cx),
            _ => Outcome::fail(
                2,
                "sh: the stand-in shell runs `sh -c SCRIPT` or reads commands from stdin",
            ),
        },
        other => Outcome::fail(127, format!("sh: {other}: not found")),
    }
}

/// Runs a script: commands separated by newlines, `;` or `&&`, with `$NAME` expanded and
/// quotes honoured. `exit` ends it.
pub(crate) fn script_run(script: &str, stdin: &[u8], cx: &mut Context<'_>) -> Outcome {
    let mut total = Outcome::default();
    for (words, only_if_ok) in parse(script, cx.env) {
        if only_if_ok && total.code != 0 {
            continue;
        }
        if words.is_empty() {
            continue;
        }
        let outcome = run(&words, stdin, cx);
        total.stdout.extend(outcome.stdout);
        total.stderr.extend(outcome.stderr);
        total.code = outcome.code;
        if outcome.exited {
            total.exited = true;
            break;
        }
    }
    total
}

/// Splits a script into commands (words after expansion), each marked whether it runs only
/// after the previous one succeeded (`&&`).
fn parse(script: &str, env: &[(String, String)]) -> Vec<(Vec<String>, bool)> {
    let mut commands = Vec::new();
    let mut words: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut after_and = false;
    let mut chars = script.chars().peekable();
    let lookup = |name: &str| {
        env.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let mut finish = |words: &mut Vec<String>, after_and: &mut bool, next_and: bool| {
        commands.push((std::mem::take(words), *after_and));
        *after_and = next_and;
    };
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    word.push(c);
                }
            }
            '"' => {
                in_word = true;
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => word.extend(chars.next()),
                        '$' => word.push_str(&lookup(&variable(&mut chars))),
                        c => word.push(c),
                    }
                }
            }
            '\\' => {
                in_word = true;
                word.extend(chars.next());
            }
            '$' => {
                in_word = true;
                word.push_str(&lookup(&variable(&mut chars)));
            }
            ' ' | '\t' | '\n' | ';' | '&' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
                match c {
                    '\n' | ';' => finish(&mut words, &mut after_and, false),
                    '&' if chars.peek() == Some(&'&') => {
                        chars.next();
                        finish(&mut words, &mut after_and, true);
                    }
                    _ => {}
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    finish(&mut words, &mut after_and, false);
    commands
}

/// A variable's name after `$`: `NAME` or `{NAME}`.
fn variable(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> String {
    let mut name = String::new();
    if chars.peek() == Some(&'{') {
        chars.next();
        for c in chars.by_ref() {
            if c == '}' {
                break;
            }
            name.push(c);
        }
        return name;
    }
    while let Some(&c) = chars.peek() {
        if !(c.is_ascii_alphanumeric() || c == '_') {
            break;
        }
        name.push(c);
        chars.next();
    }
    name
}

fn ls(args: &[String], files: &Files) -> Outcome {
    let paths: Vec<String> = args
        .iter()
        .filter(|a| !a.starts_with('-'))
        .map(|a| absolute(a))
        .collect();
    let paths = if paths.is_empty() {
        vec!["/".to_owned()]
    } else {
        paths
    };
    let mut outcome = Outcome::default();
    for path in &paths {
        if files.is_dir(path) {
            let names = files.children(path);
            outcome.stdout.extend(
                names
                    .iter()
                    .map(|n| format!("{}\n", n.trim_end_matches('/')))
                    .collect::<String>()
                    .bytes(),
            );
        } else if files.files.contains_key(path) {
            outcome.stdout.extend(format!("{path}\n").bytes());
        } else {
            outcome
                .stderr
                .extend(format!("ls: {path}: No such file or directory\n").bytes());
            outcome.code = 1;
        }
    }
    outcome
}

/// A path made absolute from `/` (the stand-in's working directory), with `.` and `..`
/// resolved and no trailing slash.
fn absolute(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    format!("/{}", parts.join("/"))
}

fn parent(path: &str) -> String {
    match path.rsplit_once('/') {
        Some(("", _)) | None => "/".to_owned(),
        Some((dir, _)) => dir.to_owned(),
    }
}

#[cfg(test)]
mod tests;
