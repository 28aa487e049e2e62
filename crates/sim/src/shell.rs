//! The shell of a simulated pod (`kubectl exec`): no process runs, but what a user tries in a
//! container answers as a small POSIX shell would, and always ends, with an exit status.
//!
//! - The pod's files: `/etc/hostname`, `/etc/hosts`, `/etc/resolv.conf`, `/etc/passwd`, the
//!   ServiceAccount's namespace, and its ConfigMap, Secret and downward API volumes at their
//!   mount paths (a key a file); its environment from the container spec (`env`, `envFrom`,
//!   `valueFrom`), as the kubelet builds it.
//! - The language: words with quotes and escapes, `$VAR`, `${VAR}`, `${VAR:-default}`, `$?`,
//!   `$(…)`; lists with `;`, newlines, `&&`, `||`; pipes; `>`/`>>`/`<`/`2>&1` redirections;
//!   `NAME=value` assignments. Loops and conditionals are refused with a message (exit 2).
//! - Commands: `echo`, `printf`, `cat`, `ls`, `hostname`, `env`, `printenv`, `export`, `cd`,
//!   `pwd`, `uname`, `true`, `false`, `:`, `exit`, `sleep`, `date`, `id`, `whoami`, `head`,
//!   `tail`, `wc`, `grep`, `test`/`[`, `which`/`command -v`, `ps`, `nproc`, and `sh`/`bash`
//!   themselves; anything else is "not found" (127).
//!
//! Pure: a run is a list of [`Step`]s (output, a pause) and an exit code, played by the exec
//! driver (`api.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

mod commands;
use commands::{date, echo, printf, sleep, which};

/// What a pod's container is, as its shell sees it.
#[derive(Clone, Debug, Default)]
pub struct Container {
    pub pod: String,
    pub namespace: String,
    pub ip: String,
    /// The container's command and arguments (PID 1 in `ps`).
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
    pub files: BTreeMap<String, Vec<u8>>,
    pub dirs: BTreeSet<String>,
    pub uid: u32,
    pub gid: u32,
}

impl Container {
    /// The files every container has, and the directories they are in.
    pub fn with_base_files(mut self) -> Self {
        let fqdn = format!("{}.{}.pod.cluster.local", self.pod, self.namespace);
        let base: [(&str, String); 7] = [
            ("/etc/hostname", format!("{}\n", self.pod)),
            (
                "/etc/hosts",
                format!(
                    "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{}\t{}\t{fqdn}\n",
                    self.ip, self.pod
                ),
            ),
            (
                "/etc/resolv.conf",
                format!(
                    "search {}.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n",
                    self.namespace
                ),
            ),
            (
                "/etc/passwd",
                "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
                    .into(),
            ),
            ("/etc/group", "root:x:0:\nnogroup:x:65534:\n".into()),
            (
                "/etc/os-release",
                "NAME=\"Orrery simulated container\"\nID=orrery-sim\nPRETTY_NAME=\"Orrery simulated container\"\n"
                    .into(),
            ),
            (
                "/var/run/secrets/kubernetes.io/serviceaccount/namespace",
                self.namespace.clone(),
            ),
        ];
        for (path, text) in base {
            self.files
                .entry(path.to_string())
                .or_insert_with(|| text.into_bytes());
        }
        self.files.insert("/dev/null".into(), Vec::new());
        for d in [
            "/",
            "/bin",
            "/dev",
            "/etc",
            "/home",
            "/proc",
            "/root",
            "/run",
            "/sbin",
            "/tmp",
            "/usr",
            "/usr/bin",
            "/usr/local",
            "/usr/local/bin",
            "/usr/sbin",
            "/var",
            "/var/run",
        ] {
            self.dirs.insert(d.to_string());
        }
        let parents: Vec<String> = self.files.keys().flat_map(|f| ancestors(f)).collect();
        self.dirs.extend(parents);
        self
    }
}

/// Every directory above `path` (`/a/b/c` → `/`, `/a`, `/a/b`).
fn ancestors(path: &str) -> Vec<String> {
    let mut out = vec!["/".to_string()];
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    for i in 1..parts.len() {
        out.push(format!("/{}", parts[..i].join("/")));
    }
    out
}

/// One thing a run does, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Out(Vec<u8>),
    Err(Vec<u8>),
    Sleep(Duration),
}

/// What a run did: its steps and exit code, and whether it asked the shell to end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ran {
    pub steps: Vec<Step>,
    pub code: i32,
    pub exit: bool,
}

/// The longest a `sleep` pauses an exec (so a forgotten one ends).
const MAX_SLEEP: Duration = Duration::from_secs(300);

/// The shell's state across the lines of an interactive session.
#[derive(Debug)]
pub struct Shell<'a> {
    c: &'a Container,
    vars: Vec<(String, String)>,
    cwd: String,
    last: i32,
    /// Files written in this session (by `>`): gone with it.
    written: BTreeMap<String, Vec<u8>>,
}

/// A command's output while it runs.
#[derive(Default)]
struct Io {
    out: Vec<u8>,
    err: Vec<u8>,
    steps: Vec<Step>,
}

impl Io {
    fn flush(&mut self) {
        if !self.out.is_empty() {
            self.steps.push(Step::Out(std::mem::take(&mut self.out)));
        }
        if !self.err.is_empty() {
            self.steps.push(Step::Err(std::mem::take(&mut self.err)));
        }
    }
    fn eprint(&mut self, s: impl AsRef<str>) {
        self.err.extend_from_slice(s.as_ref().as_bytes());
    }
    fn print(&mut self, s: impl AsRef<str>) {
        self.out.extend_from_slice(s.as_ref().as_bytes());
    }
}

/// A token of the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    /// A word: its pieces, each literal or expanded (and whether quoted, so not split).
    Word(Vec<Piece>),
    Op(&'static str),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    Lit(String),
    /// `$NAME` / `${NAME}` / `${NAME:-default}` / `$?`: (name, default, quoted).
    Var(String, Option<String>, bool),
    /// `$(...)`: (script, quoted).
    Sub(String, bool),
}

/// Why a line cannot run.
#[derive(Debug)]
struct Syntax(String);

/// An expansion `dollar` found ends the literal before it; a lone `$` is a literal.
fn expansion(word: &mut Vec<Piece>, lit: &mut String, p: Option<Piece>) {
    match p {
        Some(p) => {
            if !lit.is_empty() {
                word.push(Piece::Lit(std::mem::take(lit)));
            }
            word.push(p);
        }
        None => lit.push('$'),
    }
}
/// `$...` at chars[i] (i points at '$'); returns the piece and the next index.
fn dollar(chars: &[char], i: usize, quoted: bool) -> Result<(Option<Piece>, usize), Syntax> {
    let n = chars.get(i + 1).copied();
    match n {
        Some('(') => {
            let mut depth = 1;
            let mut j = i + 2;
            while j < chars.len() {
                match chars[j] {
                    '(' => depth += 1,
                    ')' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            if j >= chars.len() {
                return Err(Syntax("unterminated $(".into()));
            }
            let inner: String = chars[i + 2..j].iter().collect();
            Ok((Some(Piece::Sub(inner, quoted)), j + 1))
        }
        Some('{') => {
            let close = chars[i + 2..]
                .iter()
                .position(|c| *c == '}')
                .ok_or_else(|| Syntax("bad substitution".into()))?;
            let inner: String = chars[i + 2..i + 2 + close].iter().collect();
            let (name, default) = match inner.split_once(":-") {
                Some((n, d)) => (n.to_string(), Some(d.to_string())),
                None => (inner, None),
            };
            Ok((Some(Piece::Var(name, default, quoted)), i + 3 + close))
        }
        Some(c) if c == '?' || c == '$' || c == '#' || c == '@' || c.is_ascii_digit() => {
            Ok((Some(Piece::Var(c.to_string(), None, quoted)), i + 2))
        }
        Some(c) if c == '_' || c.is_ascii_alphabetic() => {
            let mut j = i + 1;
            while j < chars.len() && (chars[j] == '_' || chars[j].is_ascii_alphanumeric()) {
                j += 1;
            }
            let name: String = chars[i + 1..j].iter().collect();
            Ok((Some(Piece::Var(name, None, quoted)), j))
        }
        _ => Ok((None, i + 1)),
    }
}

/// The rest of a redirection whose first character is at `chars[i]` and whose
/// operator so far is `op` (`<`, `>` or `2>`): `>>`, `>&1`, `>&2`; the operator and the
/// index after it.
fn redirection(
    chars: &[char],
    i: usize,
    mut op: &'static str,
) -> Result<(&'static str, usize), Syntax> {
    let c = chars[i];
    let mut j = i + 1;
    if c == '>' && chars.get(j) == Some(&'>') {
        op = if op == "2>" { "2>>" } else { ">>" };
        j += 1;
    }
    if c == '>' && chars.get(j) == Some(&'&') {
        match chars.get(j + 1) {
            Some('1') if op == "2>" => {
                op = "2>&1";
                j += 2;
            }
            Some('2') if op == ">" => {
                op = ">&2";
                j += 2;
            }
            _ => return Err(Syntax("bad redirection".into())),
        }
    }
    Ok((op, j))
}

/// A double-quoted string opening at `chars[i]`: its text goes to `lit` (expansions
/// to `word`, unsplit); the index after the closing quote.
fn double_quoted(
    chars: &[char],
    i: usize,
    word: &mut Vec<Piece>,
    lit: &mut String,
) -> Result<usize, Syntax> {
    let mut j = i + 1;
    loop {
        let Some(&d) = chars.get(j) else {
            return Err(Syntax("unterminated quoted string".into()));
        };
        match d {
            '"' => break,
            '\\' if matches!(chars.get(j + 1), Some('"' | '\\' | '$' | '`')) => {
                lit.push(chars[j + 1]);
                j += 2;
            }
            '$' => {
                let (p, next) = dollar(chars, j, true)?;
                expansion(word, lit, p);
                j = next;
            }
            d => {
                lit.push(d);
                j += 1;
            }
        }
    }
    Ok(j + 1)
}

// The last end of a word resets state that nothing reads after it.
#[allow(unused_assignments)]
fn lex(src: &str) -> Result<Vec<Tok>, Syntax> {
    let chars: Vec<char> = src.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    let mut word: Vec<Piece> = Vec::new();
    let mut lit = String::new();
    let mut started = false;
    macro_rules! end_word {
        () => {
            if started {
                if !lit.is_empty() {
                    word.push(Piece::Lit(std::mem::take(&mut lit)));
                }
                if word.is_empty() {
                    word.push(Piece::Lit(String::new()));
                }
                toks.push(Tok::Word(std::mem::take(&mut word)));
                started = false;
            }
        };
    }
    while i < chars.len() {
        let c = chars[i];
        match c {
            ' ' | '\t' => {
                end_word!();
                i += 1;
            }
            '#' if !started => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '\n' | ';' => {
                end_word!();
                toks.push(Tok::Op(";"));
                i += 1;
            }
            '&' | '|' => {
                end_word!();
                let double = chars.get(i + 1) == Some(&c);
                toks.push(Tok::Op(match (c, double) {
                    ('&', true) => "&&",
                    ('|', true) => "||",
                    ('&', false) => ";",
                    _ => "|",
                }));
                i += if double { 2 } else { 1 };
            }
            '>' | '<' => {
                // `2>&1`, `2>`, `>>`, `>`, `<`, `>&2`
                let mut op: &'static str = if c == '<' { "<" } else { ">" };
                if started && lit == "2" && word.is_empty() && c == '>' {
                    lit.clear();
                    started = false;
                    op = "2>";
                }
                end_word!();
                let (op, j) = redirection(&chars, i, op)?;
                toks.push(Tok::Op(op));
                i = j;
            }
            '\'' => {
                started = true;
                let close = chars[i + 1..]
                    .iter()
                    .position(|x| *x == '\'')
                    .ok_or_else(|| Syntax("unterminated quoted string".into()))?;
                lit.extend(&chars[i + 1..i + 1 + close]);
                i += close + 2;
            }
            '"' => {
                started = true;
                i = double_quoted(&chars, i, &mut word, &mut lit)?;
            }
            '\\' => {
                started = true;
                if let Some(&n) = chars.get(i + 1)
                    && n != '\n'
                {
                    lit.push(n);
                }
                i += 2;
            }
            '$' => {
                started = true;
                let (p, next) = dollar(&chars, i, false)?;
                expansion(&mut word, &mut lit, p);
                i = next;
            }
            '(' | ')' | '`' => {
                return Err(Syntax(format!(
                    "{c}: subshells and backquotes are not supported by the simulated shell"
                )));
            }
            c => {
                started = true;
                lit.push(c);
                i += 1;
            }
        }
    }
    end_word!();
    Ok(toks)
}

/// One simple command: its words, assignments before them, and redirections.
#[derive(Debug, Default)]
struct Simple {
    assigns: Vec<(String, Vec<Piece>)>,
    words: Vec<Vec<Piece>>,
    redirs: Vec<(&'static str, Vec<Piece>)>,
}

/// `a | b | c`, optionally negated.
#[derive(Debug, Default)]
struct Pipeline {
    not: bool,
    cmds: Vec<Simple>,
}

/// The lines of a script: pipelines joined by `&&`/`||`, the lists by `;`.
type AndOr = Vec<(Option<&'static str>, Pipeline)>;

fn parse(toks: Vec<Tok>) -> Result<Vec<AndOr>, Syntax> {
    let mut lists: Vec<AndOr> = Vec::new();
    let mut cur: AndOr = Vec::new();
    let mut pipe = Pipeline::default();
    let mut simple = Simple::default();
    let mut joiner: Option<&'static str> = None;
    let mut it = toks.into_iter().peekable();
    let finish_simple = |simple: &mut Simple, pipe: &mut Pipeline| -> Result<(), Syntax> {
        if simple.words.is_empty() && simple.assigns.is_empty() && simple.redirs.is_empty() {
            return Ok(());
        }
        pipe.cmds.push(std::mem::take(simple));
        Ok(())
    };
    while let Some(t) = it.next() {
        match t {
            Tok::Word(w) => {
                let as_text = |w: &[Piece]| match w {
                    [Piece::Lit(s)] => Some(s.clone()),
                    _ => None,
                };
                if simple.words.is_empty() {
                    let text = as_text(&w).unwrap_or_default();
                    if matches!(
                        text.as_str(),
                        "if" | "then"
                            | "else"
                            | "elif"
                            | "fi"
                            | "for"
                            | "while"
                            | "until"
                            | "do"
                            | "done"
                            | "case"
                            | "esac"
                            | "function"
                    ) {
                        return Err(Syntax(format!(
                            "{text}: not supported by the simulated shell"
                        )));
                    }
                    if text == "!" && pipe.cmds.is_empty() {
                        pipe.not = !pipe.not;
                        continue;
                    }
                    // NAME=value before the command.
                    if let Some(Piece::Lit(first)) = w.first()
                        && let Some((name, rest)) = first.split_once('=')
                        && !name.is_empty()
                        && name.chars().all(|c| c == '_' || c.is_ascii_alphanumeric())
                        && !name.starts_with(|c: char| c.is_ascii_digit())
                    {
                        let mut value = vec![Piece::Lit(rest.to_string())];
                        value.extend(w[1..].iter().cloned());
                        simple.assigns.push((name.to_string(), value));
                        continue;
                    }
                }
                simple.words.push(w);
            }
            Tok::Op(op @ (">" | ">>" | "<" | "2>" | "2>>")) => match it.next() {
                Some(Tok::Word(target)) => simple.redirs.push((op, target)),
                _ => return Err(Syntax(format!("syntax error near {op}"))),
            },
            Tok::Op(op @ ("2>&1" | ">&2")) => simple.redirs.push((op, Vec::new())),
            Tok::Op("|") => {
                if simple.words.is_empty() {
                    return Err(Syntax("syntax error near |".into()));
                }
                finish_simple(&mut simple, &mut pipe)?;
            }
            Tok::Op(op @ ("&&" | "||")) => {
                finish_simple(&mut simple, &mut pipe)?;
                if pipe.cmds.is_empty() {
                    return Err(Syntax(format!("syntax error near {op}")));
                }
                cur.push((joiner, std::mem::take(&mut pipe)));
                joiner = Some(op);
            }
            Tok::Op(_) => {
                finish_simple(&mut simple, &mut pipe)?;
                if !pipe.cmds.is_empty() {
                    cur.push((joiner, std::mem::take(&mut pipe)));
                } else if joiner.is_some() {
                    return Err(Syntax("syntax error: unexpected end of command".into()));
                }
                joiner = None;
                if !cur.is_empty() {
                    lists.push(std::mem::take(&mut cur));
                }
            }
        }
    }
    finish_simple(&mut simple, &mut pipe)?;
    if !pipe.cmds.is_empty() {
        cur.push((joiner, pipe));
    } else if joiner.is_some() {
        return Err(Syntax("syntax error: unexpected end of command".into()));
    }
    if !cur.is_empty() {
        lists.push(cur);
    }
    Ok(lists)
}

/// A `sleep` argument: `5`, `0.5`, `2s`, `1m`, `1h`.
fn sleep_of(s: &str) -> Option<Duration> {
    let (num, mult) = match s.chars().last()? {
        's' => (&s[..s.len() - 1], 1.0),
        'm' => (&s[..s.len() - 1], 60.0),
        'h' => (&s[..s.len() - 1], 3600.0),
        _ => (s, 1.0),
    };
    let v: f64 = num.parse().ok()?;
    (v >= 0.0 && v.is_finite()).then(|| Duration::from_secs_f64(v * mult))
}

/// Whether `s` names a shell the container has.
pub fn is_shell(s: &str) -> bool {
    matches!(
        s.rsplit('/').next().unwrap_or(s),
        "sh" | "bash" | "ash" | "dash" | "zsh"
    )
}

const COMMANDS: &[&str] = &[
    "echo", "printf", "cat", "ls", "hostname", "env", "printenv", "export", "cd", "pwd", "uname",
    "true", "false", ":", "exit", "sleep", "date", "id", "whoami", "head", "tail", "wc", "grep",
    "test", "[", "which", "command", "type", "ps", "nproc", "sh", "bash",
];

impl<'a> Shell<'a> {
    pub fn new(c: &'a Container) -> Shell<'a> {
        Shell {
            c,
            vars: c.env.clone(),
            cwd: "/".into(),
            last: 0,
            written: BTreeMap::new(),
        }
    }

    fn var(&self, name: &str) -> Option<String> {
        match name {
            "?" => Some(self.last.to_string()),
            "$" => Some("1".into()),
            "#" => Some("0".into()),
            "0" => Some("sh".into()),
            _ => self
                .vars
                .iter()
                .rev()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone()),
        }
    }

    fn set_var(&mut self, name: &str, value: String) {
        self.vars.retain(|(k, _)| k != name);
        self.vars.push((name.to_string(), value));
    }

    /// A word's fields after expansion (an unquoted expansion splits on blanks).
    fn expand(&mut self, w: &[Piece]) -> Vec<String> {
        let mut fields: Vec<String> = vec![String::new()];
        let mut any_quoted_or_lit = false;
        for p in w {
            let (text, quoted) = match p {
                Piece::Lit(s) => {
                    any_quoted_or_lit = true;
                    (s.clone(), true)
                }
                Piece::Var(name, default, q) => {
                    let v = self.var(name).filter(|v| !v.is_empty());
                    (v.or_else(|| default.clone()).unwrap_or_default(), *q)
                }
                Piece::Sub(script, q) => {
                    let ran = self.run_script_inner(script, &[], 1);
                    let mut out = Vec::new();
                    for s in ran.steps {
                        if let Step::Out(b) = s {
                            out.extend(b);
                        }
                    }
                    let text = String::from_utf8_lossy(&out)
                        .trim_end_matches('\n')
                        .to_string();
                    (text, *q)
                }
            };
            if quoted {
                any_quoted_or_lit = true;
                if let Some(last) = fields.last_mut() {
                    last.push_str(&text);
                }
            } else {
                let mut parts = text.split_whitespace();
                if let Some(first) = parts.next() {
                    if let Some(last) = fields.last_mut() {
                        last.push_str(first);
                    }
                    for p in parts {
                        fields.push(p.to_string());
                    }
                }
            }
        }
        if !any_quoted_or_lit && fields.len() == 1 && fields[0].is_empty() {
            return Vec::new();
        }
        fields
    }

    fn path(&self, p: &str) -> String {
        let joined = if p.starts_with('/') {
            p.to_string()
        } else {
            format!("{}/{p}", self.cwd.trim_end_matches('/'))
        };
        let mut parts: Vec<&str> = Vec::new();
        for seg in joined.split('/') {
            match seg {
                "" | "." => {}
                ".." => {
                    parts.pop();
                }
                s => parts.push(s),
            }
        }
        format!("/{}", parts.join("/"))
    }

    fn file(&self, p: &str) -> Option<Vec<u8>> {
        let p = self.path(p);
        self.written
            .get(&p)
            .or_else(|| self.c.files.get(&p))
            .cloned()
    }

    fn is_dir(&self, p: &str) -> bool {
        let p = self.path(p);
        self.c.dirs.contains(&p)
    }

    /// The names in a directory.
    fn entries(&self, dir: &str) -> Vec<String> {
        let dir = self.path(dir);
        let prefix = if dir == "/" {
            "/".to_string()
        } else {
            format!("{dir}/")
        };
        let mut names: BTreeSet<String> = BTreeSet::new();
        for f in self
            .c
            .files
            .keys()
            .chain(self.written.keys())
            .chain(self.c.dirs.iter())
        {
            if let Some(rest) = f.strip_prefix(&prefix)
                && !rest.is_empty()
            {
                names.insert(rest.split('/').next().unwrap_or(rest).to_string());
            }
        }
        names.into_iter().collect()
    }

    /// Runs a whole script (`sh -c`, or a line of an interactive session).
    pub fn run_script(&mut self, src: &str, stdin: &[u8]) -> Ran {
        self.run_script_inner(src, stdin, 0)
    }

    fn run_script_inner(&mut self, src: &str, stdin: &[u8], depth: usize) -> Ran {
        let mut io = Io::default();
        if depth > 8 {
            io.eprint("sh: too deeply nested\n");
            io.flush();
            return Ran {
                steps: io.steps,
                code: 2,
                exit: false,
            };
        }
        let lists = match lex(src).and_then(parse) {
            Ok(l) => l,
            Err(Syntax(m)) => {
                io.eprint(format!("sh: {m}\n"));
                io.flush();
                self.last = 2;
                return Ran {
                    steps: io.steps,
                    code: 2,
                    exit: false,
                };
            }
        };
        let mut exit = false;
        'lists: for list in lists {
            for (join, pipe) in list {
                let run = match join {
                    Some("&&") => self.last == 0,
                    Some("||") => self.last != 0,
                    _ => true,
                };
                if !run {
                    continue;
                }
                let (code, quit) = self.pipeline(&pipe, stdin, &mut io, depth);
                self.last = code;
                if quit {
                    exit = true;
                    break 'lists;
                }
            }
        }
        io.flush();
        Ran {
            steps: io.steps,
            code: self.last,
            exit,
        }
    }

    fn pipeline(&mut self, p: &Pipeline, stdin: &[u8], io: &mut Io, depth: usize) -> (i32, bool) {
        let mut input = stdin.to_vec();
        let mut code = 0;
        let mut quit = false;
        let n = p.cmds.len();
        for (i, cmd) in p.cmds.iter().enumerate() {
            let last = i + 1 == n;
            let mut sub = Io::default();
            let (c, q) = self.simple(cmd, &input, &mut sub, depth);
            code = c;
            quit |= q && n == 1;
            // Pauses and errors go out as they come; output feeds the next command.
            sub.flush();
            let mut piped = Vec::new();
            for s in sub.steps {
                match s {
                    Step::Out(b) if !last => piped.extend(b),
                    other => {
                        io.flush();
                        io.steps.push(other);
                    }
                }
            }
            input = piped;
        }
        if p.not {
            code = i32::from(code == 0);
        }
        (code, quit)
    }

    /// One command with its redirections; (exit code, whether it was `exit`).
    fn simple(&mut self, s: &Simple, stdin: &[u8], io: &mut Io, depth: usize) -> (i32, bool) {
        let mut argv: Vec<String> = Vec::new();
        for w in &s.words {
            argv.extend(self.expand(w));
        }
        let assigns: Vec<(String, String)> = s
            .assigns
            .iter()
            .map(|(k, v)| (k.clone(), self.expand(v).join(" ")))
            .collect();
        if argv.is_empty() {
            for (k, v) in assigns {
                self.set_var(&k, v);
            }
            return (0, false);
        }
        let mut input = stdin.to_vec();
        let mut out_to: Option<(String, bool)> = None;
        let mut err_to_null = false;
        let (mut err_to_out, mut out_to_err) = (false, false);
        for (op, target) in &s.redirs {
            let t = self.expand(target).join(" ");
            match *op {
                "<" => match self.file(&t) {
                    Some(b) => input = b,
                    None => {
                        io.eprint(format!("sh: can't open {t}: no such file\n"));
                        return (1, false);
                    }
                },
                ">" | ">>" => out_to = Some((self.path(&t), *op == ">>")),
                "2>" | "2>>" => err_to_null = true,
                "2>&1" => err_to_out = true,
                ">&2" => out_to_err = true,
                _ => {}
            }
        }
        let saved: Vec<(String, String)> = assigns
            .iter()
            .map(|(k, _)| (k.clone(), self.var(k).unwrap_or_default()))
            .collect();
        for (k, v) in &assigns {
            self.set_var(k, v.clone());
        }
        let mut sub = Io::default();
        let (code, quit) = self.command(&argv, &input, &mut sub, depth);
        for (k, v) in saved {
            self.set_var(&k, v);
        }
        sub.flush();
        for step in sub.steps {
            let step = match step {
                Step::Err(b) if err_to_null => {
                    let _ = b;
                    continue;
                }
                Step::Err(b) if err_to_out => Step::Out(b),
                Step::Out(b) if out_to_err => Step::Err(b),
                other => other,
            };
            match (&out_to, step) {
                (Some((path, append)), Step::Out(b)) => {
                    if path != "/dev/null" {
                        let f = self.written.entry(path.clone()).or_default();
                        if !append {
                            f.clear();
                        }
                        f.extend(b);
                    }
                }
                (_, st) => {
                    io.flush();
                    io.steps.push(st);
                }
            }
        }
        (code, quit)
    }

    /// Runs one command; (exit code, whether it asked the shell to end).
    fn command(&mut self, argv: &[String], stdin: &[u8], io: &mut Io, depth: usize) -> (i32, bool) {
        let name = argv[0].rsplit('/').next().unwrap_or(&argv[0]).to_string();
        let args = &argv[1..];
        let found = !argv[0].contains('/')
            || [
                "/bin/",
                "/usr/bin/",
                "/sbin/",
                "/usr/sbin/",
                "/usr/local/bin/",
            ]
            .iter()
            .any(|d| argv[0].starts_with(d));
        if !found || !COMMANDS.contains(&name.as_str()) {
            if argv[0].contains('/') && self.file(&argv[0]).is_some() {
                io.eprint(format!("sh: {}: Permission denied\n", argv[0]));
                return (126, false);
            }
            io.eprint(format!("sh: {}: not found\n", argv[0]));
            return (127, false);
        }
        let code = match name.as_str() {
            "true" | ":" => 0,
            "false" => 1,
            "exit" => {
                let code = args
                    .first()
                    .map_or(Some(self.last), |a| a.parse().ok())
                    .unwrap_or(2);
                return (code, true);
            }
            "echo" => echo(args, io),
            "printf" => printf(args, io),
            "cat" => self.cat(args, stdin, io),
            "ls" => self.ls(args, io),
            "hostname" => self.hostname(args, io),
            "env" => self.env(io),
            "printenv" => self.printenv(args, io),
            "export" => self.export(args),
            "cd" => self.cd(args, io),
            "pwd" => {
                io.print(format!("{}\n", self.cwd));
                0
            }
            "uname" => self.uname(args, io),
            "sleep" => sleep(args, io),
            "date" => date(args, io),
            "id" => self.id(io),
            "whoami" => {
                io.print(if self.c.uid == 0 {
                    "root\n"
                } else {
                    "nobody\n"
                });
                0
            }
            "head" | "tail" => self.head_tail(&name, args, stdin, io),
            "wc" => self.wc(args, stdin, io),
            "grep" => self.grep(args, stdin, io),
            "test" | "[" => self.test(&name, args, io),
            "which" | "command" | "type" => which(&name, args, io),
            "ps" => self.ps(io),
            "nproc" => {
                io.print("1\n");
                0
            }
            "sh" | "bash" => self.sh(args, stdin, io, depth),
            _ => {
                io.eprint(format!("sh: {name}: not found\n"));
                127
            }
        };
        (code, false)
    }

    /// Runs a command given as words, as the kubelet execs it (no shell unless it names one).
    pub fn run_argv(&mut self, argv: &[String], stdin: &[u8]) -> Ran {
        let mut io = Io::default();
        if argv.is_empty() {
            io.eprint("exec: no command given\n");
            io.flush();
            return Ran {
                steps: io.steps,
                code: 1,
                exit: false,
            };
        }
        let name = argv[0].rsplit('/').next().unwrap_or(&argv[0]);
        if !COMMANDS.contains(&name) {
            io.eprint(format!(
                "exec: \"{}\": executable file not found in $PATH\n",
                argv[0]
            ));
            io.flush();
            return Ran {
                steps: io.steps,
                code: 127,
                exit: false,
            };
        }
        let (code, exit) = self.command(argv, stdin, &mut io, 0);
        io.flush();
        self.last = code;
        Ran {
            steps: io.steps,
            code,
            exit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container() -> Container {
        let mut c = Container {
            pod: "web-00001".into(),
            namespace: "default".into(),
            ip: "10.1.0.2".into(),
            command: vec!["nginx".into(), "-g".into(), "daemon off;".into()],
            env: vec![
                ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
                ("HOSTNAME".into(), "web-00001".into()),
                ("GREETING".into(), "hello".into()),
            ],
            ..Default::default()
        };
        c.files
            .insert("/etc/web/greeting".into(), b"hello".to_vec());
        c.files
            .insert("/etc/web/lines".into(), b"one\ntwo\nthree\n".to_vec());
        c.with_base_files()
    }

    fn out(r: &Ran) -> String {
        r.steps
            .iter()
            .filter_map(|s| match s {
                Step::Out(b) => Some(String::from_utf8_lossy(b).into_owned()),
                _ => None,
            })
            .collect()
    }

    fn err(r: &Ran) -> String {
        r.steps
            .iter()
            .filter_map(|s| match s {
                Step::Err(b) => Some(String::from_utf8_lossy(b).into_owned()),
                _ => None,
            })
            .collect()
    }

    fn sh(src: &str) -> Ran {
        let c = container();
        Shell::new(&c).run_script(src, b"")
    }

    #[test]
    fn scripts_run_as_a_shell_runs_them() {
        let r = sh("echo hi; uname -a");
        assert_eq!(
            out(&r),
            "hi\nLinux web-00001 6.1.0-orrery-sim #1 SMP x86_64 GNU/Linux\n"
        );
        assert_eq!(out(&sh("false && echo x || echo y")), "y\n");
        assert_eq!(out(&sh("true && echo both")), "both\n");
        assert_eq!(
            out(&sh("echo 'a  b' \"$GREETING, $HOSTNAME\" ${NOPE:-dflt}")),
            "a  b hello, web-00001 dflt\n"
        );
        assert_eq!(out(&sh("X=1; echo $X; echo $(echo nested)")), "1\nnested\n");
        assert_eq!(out(&sh("cat /etc/web/lines | grep t | wc -l")), "      2\n");
        assert_eq!(out(&sh("false; echo $?")), "1\n");
        assert_eq!(out(&sh("echo gone > /dev/null; echo shown")), "shown\n");
        assert_eq!(out(&sh("echo kept > /tmp/f; cat /tmp/f")), "kept\n");
        assert_eq!(out(&sh("nosuch 2>&1")), "sh: nosuch: not found\n");
        assert_eq!(out(&sh("[ -f /etc/hostname ] && echo yes")), "yes\n");
        assert_eq!(out(&sh("test 3 -gt 2 && echo more")), "more\n");
        assert_eq!(
            out(&sh("cd /etc/web; pwd; ls")),
            "/etc/web\ngreeting\nlines\n"
        );
        assert_eq!(
            out(&sh("head -n 1 /etc/web/lines; tail -n1 /etc/web/lines")),
            "one\nthree\n"
        );
        assert_eq!(out(&sh("printf '%s=%s\\n' a b")), "a=b\n");
    }

    #[test]
    fn everything_ends_with_a_status() {
        let r = sh("nosuch");
        assert_eq!((r.code, err(&r)), (127, "sh: nosuch: not found\n".into()));
        let r = sh("echo before; exit 4; echo after");
        assert_eq!((r.code, r.exit, out(&r)), (4, true, "before\n".into()));
        let r = sh("echo 'unterminated");
        assert_eq!(r.code, 2);
        assert!(err(&r).contains("unterminated quoted string"), "{r:?}");
        let r = sh("for i in 1 2; do echo $i; done");
        assert_eq!(r.code, 2);
        assert!(
            err(&r).contains("not supported by the simulated shell"),
            "{r:?}"
        );
        let r = sh("cat /nope");
        assert_eq!(
            (r.code, err(&r)),
            (1, "cat: /nope: No such file or directory\n".into())
        );
        let r = sh("ls /nope");
        assert_eq!(r.code, 2);
        let r = sh("sleep 2; echo woke");
        assert_eq!(
            r.steps,
            vec![
                Step::Sleep(Duration::from_secs(2)),
                Step::Out(b"woke\n".to_vec())
            ]
        );
        assert_eq!(sh("sleep 100000").steps, vec![Step::Sleep(MAX_SLEEP)]);
    }

    #[test]
    fn a_command_without_a_shell_is_exec_d_as_the_kubelet_does() {
        let c = container();
        let mut s = Shell::new(&c);
        let argv = |w: &[&str]| w.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let r = s.run_argv(&argv(&["cat", "/etc/hostname"]), b"");
        assert_eq!((r.code, out(&r)), (0, "web-00001\n".into()));
        let r = s.run_argv(&argv(&["cat"]), b"from stdin");
        assert_eq!(out(&r), "from stdin");
        let r = s.run_argv(&argv(&["printenv", "GREETING"]), b"");
        assert_eq!(out(&r), "hello\n");
        let r = s.run_argv(&argv(&["/bin/sh", "-c", "echo hi; echo there"]), b"");
        assert_eq!(out(&r), "hi\nthere\n");
        let r = s.run_argv(&argv(&["nosuch", "x"]), b"");
        assert_eq!(r.code, 127);
        assert!(
            err(&r).contains("executable file not found in $PATH"),
            "{r:?}"
        );
        let r = s.run_argv(&argv(&["ls", "/etc"]), b"");
        assert!(
            out(&r).contains("hostname\n") && out(&r).contains("web\n"),
            "{r:?}"
        );
        let r = s.run_argv(&argv(&["ps"]), b"");
        assert!(out(&r).contains("nginx -g daemon off;"), "{r:?}");
    }
}
