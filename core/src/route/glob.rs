//! Pure: the glob patterns Argo CD's AppProjects use (its `util/glob`, the
//! syntax of gobwas/glob): `*` any run of characters but a separator, `**`
//! any run at all, `?` one character but a separator, `[abc]`, `[a-z]`,
//! `[!a-z]` one character of (or not of) a class, `{a,b}` alternatives,
//! `\` takes the next character literally. A pattern that does not parse
//! matches nothing, as in Argo CD.
//!
//! Matching is a table over pattern and text (never backtracking), so a
//! hostile pattern costs at most their product; alternatives are expanded
//! up to [`MAX_ALTERNATIVES`] patterns, beyond which nothing matches.

/// Beyond this many expanded alternatives a pattern matches nothing.
pub const MAX_ALTERNATIVES: usize = 256;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Char(char),
    /// `?`
    One,
    /// `*`
    Star,
    /// `**`
    SuperStar,
    /// `[...]`: ranges, negated when `[!...]`.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

/// Whether `text` matches `pattern`, `separators` bounding `*` and `?`.
pub fn matches(pattern: &str, text: &str, separators: &[char]) -> bool {
    let Some(patterns) = expand(pattern) else {
        return false;
    };
    let text: Vec<char> = text.chars().collect();
    patterns.iter().any(|p| match tokens(p) {
        Some(t) => match_tokens(&t, &text, separators),
        None => false,
    })
}

/// `pattern` with its `{a,b}` alternatives expanded; `None` when it does
/// not parse or expands to too many.
fn expand(pattern: &str) -> Option<Vec<String>> {
    let chars: Vec<char> = pattern.chars().collect();
    let (out, end) = expand_seq(&chars, 0, false)?;
    (end == chars.len()).then_some(out)
}

/// Expands from `i` up to the end, or (inside braces) up to the `,` or `}`
/// that ends this alternative; returns the expansions and where it stopped.
fn expand_seq(chars: &[char], mut i: usize, nested: bool) -> Option<(Vec<String>, usize)> {
    let mut out = vec![String::new()];
    let push = |out: &mut Vec<String>, s: &str| out.iter_mut().for_each(|o| o.push_str(s));
    while i < chars.len() {
        match chars[i] {
            '\\' => {
                let next = *chars.get(i + 1)?;
                push(&mut out, &format!("\\{next}"));
                i += 2;
            }
            '[' => {
                // A class is copied whole: `,` and `}` inside it are literal.
                let close = chars[i + 1..].iter().position(|&c| c == ']')? + i + 1;
                let class: String = chars[i..=close].iter().collect();
                push(&mut out, &class);
                i = close + 1;
            }
            '{' => {
                let mut alternatives = Vec::new();
                let mut j = i + 1;
                loop {
                    let (alt, end) = expand_seq(chars, j, true)?;
                    alternatives.extend(alt);
                    match chars.get(end)? {
                        ',' => j = end + 1,
                        '}' => {
                            i = end + 1;
                            break;
                        }
                        _ => return None,
                    }
                }
                if out.len() * alternatives.len() > MAX_ALTERNATIVES {
                    return None;
                }
                out = out
                    .iter()
                    .flat_map(|o| alternatives.iter().map(move |a| format!("{o}{a}")))
                    .collect();
            }
            ',' | '}' if nested => return Some((out, i)),
            c => {
                push(&mut out, &c.to_string());
                i += 1;
            }
        }
    }
    if nested {
        // An unclosed `{`.
        return None;
    }
    Some((out, i))
}

/// The tokens of a pattern without alternatives.
fn tokens(pattern: &str) -> Option<Vec<Token>> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '\\' => {
                out.push(Token::Char(*chars.get(i + 1)?));
                i += 2;
            }
            '*' if chars.get(i + 1) == Some(&'*') => {
                out.push(Token::SuperStar);
                i += 2;
            }
            '*' => {
                out.push(Token::Star);
                i += 1;
            }
            '?' => {
                out.push(Token::One);
                i += 1;
            }
            '[' => {
                let mut j = i + 1;
                let negated = chars.get(j) == Some(&'!');
                if negated {
                    j += 1;
                }
                let mut ranges = Vec::new();
                while *chars.get(j)? != ']' {
                    let lo = chars[j];
                    if chars.get(j + 1) == Some(&'-') && chars.get(j + 2).is_some_and(|&c| c != ']')
                    {
                        let hi = chars[j + 2];
                        if hi < lo {
                            return None;
                        }
                        ranges.push((lo, hi));
                        j += 3;
                    } else {
                        ranges.push((lo, lo));
                        j += 1;
                    }
                }
                if ranges.is_empty() {
                    return None;
                }
                out.push(Token::Class { negated, ranges });
                i = j + 1;
            }
            c => {
                out.push(Token::Char(c));
                i += 1;
            }
        }
    }
    Some(out)
}

fn match_tokens(tokens: &[Token], text: &[char], separators: &[char]) -> bool {
    let sep = |c: char| separators.contains(&c);
    // row[j]: the tokens so far match text[..j].
    let mut row = vec![false; text.len() + 1];
    row[0] = true;
    for t in tokens {
        let mut next = vec![false; text.len() + 1];
        for j in 0..=text.len() {
            next[j] = match t {
                Token::Star => row[j] || (j > 0 && next[j - 1] && !sep(text[j - 1])),
                Token::SuperStar => row[j] || (j > 0 && next[j - 1]),
                _ if j == 0 => false,
                Token::Char(c) => row[j - 1] && text[j - 1] == *c,
                Token::One => row[j - 1] && !sep(text[j - 1]),
                Token::Class { negated, ranges } => {
                    let c = text[j - 1];
                    row[j - 1] && ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&c)) != *negated
                }
            };
        }
        row = next;
    }
    row[text.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_argo_cd_matches_them() {
        // (pattern, text, separators, matches)
        let cases: &[(&str, &str, &[char], bool)] = &[
            ("*", "", &[], true),
            ("*", "anything/at/all", &[], true),
            ("aaa-*", "aaa-team", &[], true),
            ("aaa-*", "aaa-", &[], true),
            ("aaa-*", "kube-system", &[], false),
            ("aaa-*", "xaaa-team", &[], false),
            ("a?c", "abc", &[], true),
            ("a?c", "ac", &[], false),
            ("[ab]-x", "b-x", &[], true),
            ("[!ab]-x", "b-x", &[], false),
            ("[!ab]-x", "c-x", &[], true),
            ("team-[0-9]", "team-7", &[], true),
            ("team-[0-9]", "team-x", &[], false),
            ("{dev,prod}-*", "prod-1", &[], true),
            ("{dev,prod}-*", "test-1", &[], false),
            ("{a,{b,c}}", "c", &[], true),
            ("a\\*", "a*", &[], true),
            ("a\\*", "ab", &[], false),
            // Separators: `*` stops at `/`, `**` does not.
            (
                "https://github.com/org/*",
                "https://github.com/org/repo",
                &['/'],
                true,
            ),
            (
                "https://github.com/org/*",
                "https://github.com/org/a/b",
                &['/'],
                false,
            ),
            (
                "https://github.com/org/**",
                "https://github.com/org/a/b",
                &['/'],
                true,
            ),
            (
                "https://github.com/*/repo",
                "https://github.com/evil/repo",
                &['/'],
                true,
            ),
            // Patterns that do not parse match nothing.
            ("[ab", "a", &[], false),
            ("{a,b", "a", &[], false),
            ("a\\", "a", &[], false),
            ("[]", "]", &[], false),
        ];
        for (i, (p, t, sep, want)) in cases.iter().enumerate() {
            assert_eq!(matches(p, t, sep), *want, "case {i}: {p:?} against {t:?}");
        }
    }

    #[test]
    fn hostile_patterns_cost_little_and_match_nothing_when_too_wide() {
        let stars = "*a".repeat(200);
        let text = "a".repeat(2000) + "b";
        let started = std::time::Instant::now();
        assert!(!matches(&stars, &text, &[]));
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        let wide = "{a,b}".repeat(9); // 512 alternatives
        assert!(!matches(&wide, &"a".repeat(9), &[]));
        let fits = "{a,b}".repeat(8);
        assert!(matches(&fits, &"ab".repeat(4), &[]));
    }
}
