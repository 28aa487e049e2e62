//! The simulated shell's commands, one function each (`Shell::command` dispatches to them).

use super::*;

/// `echo [-n] WORDS...`.
pub(super) fn echo(args: &[String], io: &mut Io) -> i32 {
    let (newline, words) = match args.first().map(String::as_str) {
        Some("-n") => (false, &args[1..]),
        _ => (true, args),
    };
    io.print(words.join(" "));
    if newline {
        io.print("\n");
    }
    0
}

/// `printf FORMAT [ARGS...]`: `\n`, `\t`, `\\` and `%s`/`%d`-like conversions.
pub(super) fn printf(args: &[String], io: &mut Io) -> i32 {
    let Some(fmt) = args.first() else {
        io.eprint("printf: usage: printf format [arguments]\n");
        return 2;
    };
    let mut rest = args[1..].iter();
    let mut out = String::new();
    let mut chars = fmt.chars().peekable();
    while let Some(ch) = chars.next() {
        match ch {
            '\\' => match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some('\\') => out.push('\\'),
                Some(o) => {
                    out.push('\\');
                    out.push(o);
                }
                None => out.push('\\'),
            },
            '%' => match chars.next() {
                Some('s' | 'd' | 'i' | 'u') => out.push_str(rest.next().map_or("", String::as_str)),
                Some('%') => out.push('%'),
                Some(o) => {
                    out.push('%');
                    out.push(o);
                }
                None => out.push('%'),
            },
            o => out.push(o),
        }
    }
    io.print(out);
    0
}

/// `sleep DURATION`: a pause step (capped at `MAX_SLEEP`).
pub(super) fn sleep(args: &[String], io: &mut Io) -> i32 {
    match args.first().and_then(|a| sleep_of(a)) {
        Some(d) => {
            io.flush();
            io.steps.push(Step::Sleep(d.min(MAX_SLEEP)));
            0
        }
        None => {
            io.eprint("sleep: invalid time interval\n");
            1
        }
    }
}

/// `date [+FORMAT]`: the real time now.
pub(super) fn date(args: &[String], io: &mut Io) -> i32 {
    let now = jiff::Timestamp::now();
    let text = match args.iter().find(|a| a.starts_with('+')) {
        Some(fmt) => now.strftime(&fmt[1..]).to_string(),
        None => now.strftime("%a %b %e %H:%M:%S UTC %Y").to_string(),
    };
    io.print(format!("{text}\n"));
    0
}

/// `which`/`command`/`type` `NAME...` (`name` says which): where each known command is.
pub(super) fn which(name: &str, args: &[String], io: &mut Io) -> i32 {
    let names: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let mut code = 0;
    for n in names {
        if COMMANDS.contains(&n.as_str()) {
            if name == "type" {
                io.print(format!("{n} is /bin/{n}\n"));
            } else {
                io.print(format!("/bin/{n}\n"));
            }
        } else {
            code = 1;
        }
    }
    code
}

impl Shell<'_> {
    /// `cat [FILE|-]...`: the files (or stdin) in turn.
    pub(super) fn cat(&self, args: &[String], stdin: &[u8], io: &mut Io) -> i32 {
        let mut code = 0;
        let files: Vec<&String> = args
            .iter()
            .filter(|a| !a.starts_with('-') || *a == "-")
            .collect();
        if files.is_empty() {
            io.out.extend_from_slice(stdin);
        }
        for f in files {
            if f == "-" {
                io.out.extend_from_slice(stdin);
            } else if self.is_dir(f) {
                io.eprint(format!("cat: {f}: Is a directory\n"));
                code = 1;
            } else {
                match self.file(f) {
                    Some(b) => io.out.extend(b),
                    None => {
                        io.eprint(format!("cat: {f}: No such file or directory\n"));
                        code = 1;
                    }
                }
            }
        }
        code
    }

    /// `ls [-la] [PATH...]`: a listing in busybox's layout.
    pub(super) fn ls(&self, args: &[String], io: &mut Io) -> i32 {
        let flags: String = args
            .iter()
            .filter(|a| a.starts_with('-'))
            .flat_map(|a| a.chars().skip(1))
            .collect();
        let paths: Vec<String> = args
            .iter()
            .filter(|a| !a.starts_with('-'))
            .cloned()
            .collect();
        let paths = if paths.is_empty() {
            vec![".".to_string()]
        } else {
            paths
        };
        let long = flags.contains('l');
        let all = flags.contains('a') || flags.contains('A');
        let mut code = 0;
        let several = paths.len() > 1;
        for (i, p) in paths.iter().enumerate() {
            if self.is_dir(p) {
                if several {
                    io.print(format!("{}{p}:\n", if i > 0 { "\n" } else { "" }));
                }
                let mut names = self.entries(p);
                if !all {
                    names.retain(|n| !n.starts_with('.'));
                }
                for n in names {
                    if long {
                        let full = format!("{}/{n}", self.path(p).trim_end_matches('/'));
                        let (kind, size) = if self.is_dir(&full) {
                            ("d", 4096)
                        } else {
                            ("-", self.file(&full).map_or(0, |b| b.len()))
                        };
                        io.print(format!(
                            "{kind}rw-r--r--    1 root     root    {size:>8} Jan  1 00:00 {n}\n"
                        ));
                    } else {
                        io.print(format!("{n}\n"));
                    }
                }
            } else if self.file(p).is_some() {
                io.print(format!("{p}\n"));
            } else {
                io.eprint(format!("ls: {p}: No such file or directory\n"));
                code = 2;
            }
        }
        code
    }

    /// `hostname [-i]`: the pod's name or IP.
    pub(super) fn hostname(&self, args: &[String], io: &mut Io) -> i32 {
        let c = self.c;
        if args.first().is_some_and(|a| a == "-i") {
            io.print(format!("{}\n", c.ip));
        } else {
            io.print(format!("{}\n", c.pod));
        }
        0
    }

    /// `env`: every variable.
    pub(super) fn env(&self, io: &mut Io) -> i32 {
        for (k, v) in &self.vars {
            io.print(format!("{k}={v}\n"));
        }
        0
    }

    /// `printenv [NAME...]`: every variable, or the named ones (1 if one is unset).
    pub(super) fn printenv(&self, args: &[String], io: &mut Io) -> i32 {
        if args.is_empty() {
            for (k, v) in &self.vars {
                io.print(format!("{k}={v}\n"));
            }
            0
        } else {
            let mut code = 0;
            for a in args {
                match self.var(a) {
                    Some(v) => io.print(format!("{v}\n")),
                    None => code = 1,
                }
            }
            code
        }
    }

    /// `export NAME=VALUE...`.
    pub(super) fn export(&mut self, args: &[String]) -> i32 {
        for a in args {
            if let Some((k, v)) = a.split_once('=') {
                self.set_var(k, v.to_string());
            }
        }
        0
    }

    /// `cd [DIR]` (default `/root`).
    pub(super) fn cd(&mut self, args: &[String], io: &mut Io) -> i32 {
        let to = args.first().cloned().unwrap_or_else(|| "/root".into());
        if self.is_dir(&to) {
            self.cwd = self.path(&to);
            0
        } else {
            io.eprint(format!(
                "sh: cd: can't cd to {to}: No such file or directory\n"
            ));
            2
        }
    }

    /// `uname [-asnrvmo]`.
    pub(super) fn uname(&self, args: &[String], io: &mut Io) -> i32 {
        let c = self.c;
        let all = [
            ("s", "Linux".to_string()),
            ("n", c.pod.clone()),
            ("r", "6.1.0-orrery-sim".to_string()),
            ("v", "#1 SMP".to_string()),
            ("m", "x86_64".to_string()),
            ("o", "GNU/Linux".to_string()),
        ];
        let flags: String = args.iter().flat_map(|a| a.chars().skip(1)).collect();
        let chosen: Vec<&String> = if flags.contains('a') {
            all.iter().map(|(_, v)| v).collect()
        } else if flags.is_empty() {
            vec![&all[0].1]
        } else {
            all.iter()
                .filter(|(f, _)| flags.contains(f))
                .map(|(_, v)| v)
                .collect()
        };
        io.print(format!(
            "{}\n",
            chosen
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        ));
        0
    }

    /// `id`: root or nobody, as the container runs.
    pub(super) fn id(&self, io: &mut Io) -> i32 {
        let c = self.c;
        let user = if c.uid == 0 { "root" } else { "nobody" };
        io.print(format!(
            "uid={}({user}) gid={}({user}) groups={}({user})\n",
            c.uid, c.gid, c.gid
        ));
        0
    }

    /// `head`/`tail` `[-n N|-N] [FILE]` (`name` says which); `-f` is refused.
    pub(super) fn head_tail(&self, name: &str, args: &[String], stdin: &[u8], io: &mut Io) -> i32 {
        let mut n = 10usize;
        let mut files = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if a == "-n" {
                n = it.next().and_then(|v| v.parse().ok()).unwrap_or(10);
            } else if let Some(v) = a.strip_prefix("-n") {
                n = v.parse().unwrap_or(10);
            } else if a == "-f" {
                io.eprint(format!(
                    "{name}: -f is not supported by the simulated shell\n"
                ));
                return 1;
            } else if let Some(v) = a.strip_prefix('-') {
                n = v.parse().unwrap_or(10);
            } else {
                files.push(a.clone());
            }
        }
        let text = match files.first() {
            None => stdin.to_vec(),
            Some(f) => match self.file(f) {
                Some(b) => b,
                None => {
                    io.eprint(format!("{name}: {f}: No such file or directory\n"));
                    return 1;
                }
            },
        };
        let text = String::from_utf8_lossy(&text).into_owned();
        let lines: Vec<&str> = text.lines().collect();
        let chosen = if name == "head" {
            &lines[..n.min(lines.len())]
        } else {
            &lines[lines.len().saturating_sub(n)..]
        };
        for l in chosen {
            io.print(format!("{l}\n"));
        }
        0
    }

    /// `wc [-lwc] [FILE]`.
    pub(super) fn wc(&self, args: &[String], stdin: &[u8], io: &mut Io) -> i32 {
        let flags: String = args
            .iter()
            .filter(|a| a.starts_with('-'))
            .flat_map(|a| a.chars().skip(1))
            .collect();
        let file = args.iter().find(|a| !a.starts_with('-'));
        let data = match file {
            None => stdin.to_vec(),
            Some(f) => match self.file(f) {
                Some(b) => b,
                None => {
                    io.eprint(format!("wc: {f}: No such file or directory\n"));
                    return 1;
                }
            },
        };
        let text = String::from_utf8_lossy(&data);
        let (l, w, ch) = (
            data.iter().filter(|b| **b == b'\n').count(),
            text.split_whitespace().count(),
            data.len(),
        );
        let mut cols = Vec::new();
        if flags.is_empty() || flags.contains('l') {
            cols.push(l);
        }
        if flags.is_empty() || flags.contains('w') {
            cols.push(w);
        }
        if flags.is_empty() || flags.contains('c') {
            cols.push(ch);
        }
        let mut line: Vec<String> = cols.iter().map(|c| format!("{c:>7}")).collect();
        if let Some(f) = file {
            line.push(f.clone());
        }
        io.print(format!("{}\n", line.join(" ")));
        0
    }

    /// `grep [-ivcqn] PATTERN [FILE]`: fixed strings, not regular expressions.
    pub(super) fn grep(&self, args: &[String], stdin: &[u8], io: &mut Io) -> i32 {
        let flags: String = args
            .iter()
            .take_while(|a| a.starts_with('-'))
            .flat_map(|a| a.chars().skip(1))
            .collect();
        let rest: Vec<&String> = args.iter().skip_while(|a| a.starts_with('-')).collect();
        let Some(pattern) = rest.first() else {
            io.eprint("grep: usage: grep [-ivcqn] PATTERN [FILE]...\n");
            return 2;
        };
        let fold = flags.contains('i');
        let want = if fold {
            pattern.to_lowercase()
        } else {
            pattern.to_string()
        };
        let data = match rest.get(1) {
            None => stdin.to_vec(),
            Some(f) => match self.file(f) {
                Some(b) => b,
                None => {
                    io.eprint(format!("grep: {f}: No such file or directory\n"));
                    return 2;
                }
            },
        };
        let text = String::from_utf8_lossy(&data).into_owned();
        let mut hits = 0;
        for (i, l) in text.lines().enumerate() {
            let hay = if fold {
                l.to_lowercase()
            } else {
                l.to_string()
            };
            if hay.contains(&want) != flags.contains('v') {
                hits += 1;
                if !flags.contains('q') && !flags.contains('c') {
                    if flags.contains('n') {
                        io.print(format!("{}:{l}\n", i + 1));
                    } else {
                        io.print(format!("{l}\n"));
                    }
                }
            }
        }
        if flags.contains('c') {
            io.print(format!("{hits}\n"));
        }
        i32::from(hits == 0)
    }

    /// `test EXPR` / `[ EXPR ]` (`name` says which): one unary or binary test, maybe negated.
    pub(super) fn test(&self, name: &str, args: &[String], io: &mut Io) -> i32 {
        let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
        if name == "[" {
            if a.last() != Some(&"]") {
                io.eprint("[: missing ]\n");
                return 2;
            }
            a.pop();
        }
        let mut negate = false;
        if a.first() == Some(&"!") {
            negate = true;
            a.remove(0);
        }
        let r = match a.as_slice() {
            [] => false,
            [s] => !s.is_empty(),
            ["-e", p] => self.file(p).is_some() || self.is_dir(p),
            ["-f", p] => self.file(p).is_some(),
            ["-d", p] => self.is_dir(p),
            ["-s", p] => self.file(p).is_some_and(|b| !b.is_empty()),
            ["-r" | "-w", p] => self.file(p).is_some() || self.is_dir(p),
            ["-z", s] => s.is_empty(),
            ["-n", s] => !s.is_empty(),
            [x, "=" | "==", y] => x == y,
            [x, "!=", y] => x != y,
            [x, op, y] => {
                let (Ok(x), Ok(y)) = (x.parse::<i64>(), y.parse::<i64>()) else {
                    io.eprint(format!("{name}: integer expression expected\n"));
                    return 2;
                };
                match *op {
                    "-eq" => x == y,
                    "-ne" => x != y,
                    "-lt" => x < y,
                    "-le" => x <= y,
                    "-gt" => x > y,
                    "-ge" => x >= y,
                    _ => {
                        io.eprint(format!("{name}: unknown operator {op}\n"));
                        return 2;
                    }
                }
            }
            _ => {
                io.eprint(format!("{name}: too many arguments\n"));
                return 2;
            }
        };
        i32::from(r == negate)
    }

    /// `ps`: the container's one process.
    pub(super) fn ps(&self, io: &mut Io) -> i32 {
        let c = self.c;
        io.print("PID   USER     TIME  COMMAND\n");
        io.print(format!(
            "    1 root      0:00 {}\n",
            if c.command.is_empty() {
                "/pause".to_string()
            } else {
                c.command.join(" ")
            }
        ));
        0
    }

    /// `sh`/`bash` `[-c SCRIPT]`: a nested shell on a copy of this one's state; its files come back.
    pub(super) fn sh(&mut self, args: &[String], stdin: &[u8], io: &mut Io, depth: usize) -> i32 {
        // `sh -c SCRIPT [ARG0 ARGS...]`, `sh -e -c ...`; a nested interactive shell
        // reads the stdin it was given.
        let mut it = args.iter();
        let mut script = None;
        while let Some(a) = it.next() {
            if a == "-c" {
                script = it.next().cloned();
                break;
            } else if a.starts_with('-') {
                continue;
            } else {
                io.eprint(format!("sh: can't open '{a}': No such file or directory\n"));
                return 2;
            }
        }
        let src = match script {
            Some(s) => s,
            None => String::from_utf8_lossy(stdin).into_owned(),
        };
        let mut inner = Shell {
            c: self.c,
            vars: self.vars.clone(),
            cwd: self.cwd.clone(),
            last: 0,
            written: self.written.clone(),
        };
        let ran = inner.run_script_inner(&src, &[], depth + 1);
        self.written = inner.written;
        io.flush();
        io.steps.extend(ran.steps);
        ran.code
    }
}
