//! The house rules on the product crates' sources (docs/architecture.md,
//! "Small parts"): no file over 500 lines before its tests, no function
//! over 80 lines, no struct over 12 fields. The parts that break a rule
//! today are listed in [`KNOWN`] with their size; a new one, or a listed
//! one that grows past its figure, fails this test, and so does a listed
//! one that meets the rule (take it off), so the list can only shrink.
//!
//! The reading is lexical (braces and field lines, comments and strings
//! skipped), which is exact for rustfmt's layout; generated code
//! (`generated/`, `gen/`) and tests (`tests.rs`, `tests/`, `#[cfg(test)]`
//! and below) are not counted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const FILE_MAX: usize = 500;
const FN_MAX: usize = 80;
const STRUCT_MAX: usize = 12;

/// The product crates' source folders, from the workspace root.
const ROOTS: &[&str] = &[
    "apis/src",
    "core/src",
    "runtime/src",
    "proto/src",
    "hub-controller/src",
    "spoke-agent/src",
    "addon/src",
    "plugin/src",
];

/// What breaks a rule today: (kind, where, size). `where` is the file for
/// `file`, `file::name` for `fn` and `struct`.
const KNOWN: &[(&str, &str, usize)] = &[
    ("fn", "addon/src/agent.rs::add_on_template", 81),
    ("struct", "spoke-agent/src/lib.rs::Args", 20),
    (
        "struct",
        "hub-controller/src/transport/grpc/mod.rs::GrpcArgs",
        14,
    ),
    ("struct", "spoke-agent/src/state.rs::Inner", 13),
    ("struct", "spoke-agent/src/lib.rs::AgentConfig", 13),
    (
        "struct",
        "hub-controller/src/transport/manifestwork/mod.rs::Context",
        13,
    ),
];

#[test]
fn no_part_is_larger_than_the_house_rules_allow_beyond_the_known_ones() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let found = measure(&root);
    let mut known: BTreeMap<(&str, &str), usize> =
        KNOWN.iter().map(|&(k, w, n)| ((k, w), n)).collect();
    let mut problems = Vec::new();
    for (kind, what, size) in &found {
        match known.remove(&(kind.as_str(), what.as_str())) {
            None => problems.push(format!(
                "{kind} {what} has {size}, over the rule ({}): split it",
                limit(kind)
            )),
            Some(was) if *size > was => problems.push(format!(
                "{kind} {what} grew from {was} to {size}: split it rather than grow it"
            )),
            Some(was) if *size < was => {
                println!(
                    "{kind} {what} shrank from {was} to {size}: its figure in KNOWN may follow"
                )
            }
            Some(_) => {}
        }
    }
    for ((kind, what), _) in known {
        problems.push(format!(
            "{kind} {what} is within the rule now (or gone): take it off KNOWN"
        ));
    }
    for kind in ["file", "fn", "struct"] {
        let n = found.iter().filter(|(k, _, _)| k == kind).count();
        println!("{kind}s over {}: {n}", limit(kind));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

fn limit(kind: &str) -> String {
    match kind {
        "file" => format!("{FILE_MAX} lines before the tests"),
        "fn" => format!("{FN_MAX} lines"),
        _ => format!("{STRUCT_MAX} fields"),
    }
}

/// Every part over a rule: (kind, where, size).
fn measure(root: &Path) -> Vec<(String, String, usize)> {
    let mut out = Vec::new();
    for dir in ROOTS {
        for file in rust_files(&root.join(dir)) {
            let name = file
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if name.contains("/generated/") || name.contains("/gen/") || name.ends_with("tests.rs")
            {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            out.extend(measure_file(&name, &text));
        }
    }
    out
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return files;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "tests") {
                files.extend(rust_files(&path));
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

fn measure_file(name: &str, text: &str) -> Vec<(String, String, usize)> {
    let lines: Vec<String> = text.lines().map(code_of).collect();
    let cut = text
        .lines()
        .position(|l| l.starts_with("#[cfg(test)]"))
        .unwrap_or(lines.len());
    let mut out = Vec::new();
    if cut > FILE_MAX {
        out.push(("file".to_string(), name.to_string(), cut));
    }
    for k in 0..cut {
        if let Some(f) = item_name(&lines[k], "fn") {
            if let Some(end) = body_end(&lines, k) {
                let n = end - k + 1;
                if n > FN_MAX {
                    out.push(("fn".into(), format!("{name}::{f}"), n));
                }
            }
        } else if let Some(s) = item_name(&lines[k], "struct") {
            if !lines[k].trim_end().ends_with('{') {
                continue;
            }
            if let Some(end) = body_end(&lines, k) {
                let n = fields(&lines[k + 1..end]);
                if n > STRUCT_MAX {
                    out.push(("struct".into(), format!("{name}::{s}"), n));
                }
            }
        }
    }
    out
}

/// The name of the `fn` or `struct` this line declares, if it does.
fn item_name(line: &str, keyword: &str) -> Option<String> {
    let words: Vec<&str> = line
        .split(|c: char| c.is_whitespace() || c == '(' || c == '<' || c == '{')
        .filter(|w| !w.is_empty())
        .collect();
    let mut i = 0;
    while i < words.len() {
        match words[i] {
            w if w.starts_with("pub") => i += 1,
            "crate)" | "super)" | "async" | "const" | "unsafe" | "in" => i += 1,
            w if w == keyword => {
                return words
                    .get(i + 1)
                    .map(|n| n.trim_end_matches(':').to_string());
            }
            _ => return None,
        }
    }
    None
}

/// The line that closes the body opened at or after `start`; None for a
/// declaration without one (`fn f();`, `struct S;`).
fn body_end(lines: &[String], start: usize) -> Option<usize> {
    let mut depth = 0i32;
    let mut opened = false;
    for (k, line) in lines.iter().enumerate().skip(start) {
        for c in line.chars() {
            match c {
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => depth -= 1,
                _ => {}
            }
        }
        if opened && depth <= 0 {
            return Some(k);
        }
        if !opened && line.trim_end().ends_with(';') {
            return None;
        }
    }
    None
}

/// The fields among a struct body's lines: `name: Type` at the body's own
/// depth.
fn fields(body: &[String]) -> usize {
    let mut depth = 0i32;
    let mut n = 0;
    for line in body {
        let l = line.trim();
        if depth == 0 && is_field(l) {
            n += 1;
        }
        for c in l.chars() {
            match c {
                '{' | '(' | '<' | '[' => depth += 1,
                '}' | ')' | '>' | ']' => depth -= 1,
                _ => {}
            }
        }
        // `->` and `=>` are no closing brackets.
        depth += (l.matches("->").count() + l.matches("=>").count()) as i32;
        depth = depth.max(0);
    }
    n
}

fn is_field(line: &str) -> bool {
    let l = line
        .strip_prefix("pub(crate) ")
        .or_else(|| line.strip_prefix("pub(super) "))
        .or_else(|| line.strip_prefix("pub "))
        .unwrap_or(line);
    let Some((name, rest)) = l.split_once(':') else {
        return false;
    };
    !rest.starts_with(':')
        && !name.is_empty()
        && name.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// The line without its comment and with its string and char literals
/// emptied, so that braces inside them do not count.
fn code_of(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => break,
            '"' => {
                out.push('"');
                while let Some(s) = chars.next() {
                    match s {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
                out.push('"');
            }
            '\'' => {
                // A char literal ('{', '\n'); a lifetime ('a) has no closing quote.
                let rest: String = chars.clone().take(3).collect();
                let close = if rest.starts_with('\\') {
                    rest.chars().nth(2) == Some('\'')
                } else {
                    rest.chars().nth(1) == Some('\'')
                };
                if close {
                    let skip = if rest.starts_with('\\') { 3 } else { 2 };
                    for _ in 0..skip {
                        chars.next();
                    }
                    out.push_str("''");
                } else {
                    out.push('\'');
                }
            }
            _ => out.push(c),
        }
    }
    out
}

#[test]
fn the_reading_finds_what_it_must() {
    let big_fn = format!(
        "fn small() {{}}\npub(crate) async fn big(x: u8) -> u8 {{\n{}}}\n",
        "    let _ = '{';\n".repeat(FN_MAX)
    );
    let found = measure_file("x.rs", &big_fn);
    assert_eq!(found, vec![("fn".into(), "x.rs::big".into(), FN_MAX + 2)]);

    let fields: String = (0..=STRUCT_MAX)
        .map(|i| format!("    pub f{i}: HashMap<String, Vec<u8>>,\n    /// a: b {{\n"))
        .collect();
    let wide = format!("pub struct Wide {{\n{fields}    g: fn(u8) -> u8,\n}}\nstruct Unit;\n");
    let found = measure_file("y.rs", &wide);
    assert_eq!(
        found,
        vec![("struct".into(), "y.rs::Wide".into(), STRUCT_MAX + 2)]
    );

    let long = format!(
        "{}#[cfg(test)]\nmod tests {{\n{}}}\n",
        "// a\n".repeat(FILE_MAX),
        "fn t() {}\n".repeat(FILE_MAX)
    );
    assert!(measure_file("z.rs", &long).is_empty());
    let longer = "// a\n".repeat(FILE_MAX + 1);
    assert_eq!(
        measure_file("z.rs", &longer),
        vec![("file".into(), "z.rs".into(), FILE_MAX + 1)]
    );
}
