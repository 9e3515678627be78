//! One source file read as text: comments and literals blanked,
//! `#[cfg(test)]` items left out, and every path it names made absolute
//! (from the crate root).

use std::collections::BTreeMap;
use std::ops::Range;

use super::Site;

/// A non-test `.rs` file of a crate's `src/`, outside `src/bin/`.
pub(super) struct SourceFile {
    /// Relative to `src/`, with `/` separators.
    pub(super) path: String,
    /// The module the file holds, from the crate root: `[]` for `lib.rs`,
    /// `["xds", "cds"]` for `xds/cds.rs` or `xds/cds/mod.rs`.
    pub(super) module: Vec<String>,
    masked: Masked,
}

impl SourceFile {
    /// The files of `(path relative to src/, text)` pairs that are not
    /// tests: neither under a `#[cfg(test)] mod name;` (its file and all
    /// under its folder), nor `#![cfg(test)]`, nor in `bin/`.
    pub(super) fn select<I, P, T>(files: I) -> Vec<Self>
    where
        I: IntoIterator<Item = (P, T)>,
        P: AsRef<str>,
        T: AsRef<str>,
    {
        let files: BTreeMap<String, Masked> = files
            .into_iter()
            .filter(|(p, _)| p.as_ref().ends_with(".rs") && !p.as_ref().starts_with("bin/"))
            .map(|(p, t)| (p.as_ref().to_string(), Masked::new(t.as_ref())))
            .collect();
        // Files of `#[cfg(test)] mod name;`: `<dir>/name.rs` and all under `<dir>/name/`.
        let excluded: Vec<String> = files
            .iter()
            .flat_map(|(path, m)| {
                let dir = child_dir(path);
                m.test_mods
                    .iter()
                    .map(move |name| format!("{dir}{name}"))
                    .collect::<Vec<_>>()
            })
            .collect();
        let is_excluded = |path: &str| {
            excluded
                .iter()
                .any(|e| path == format!("{e}.rs") || path.starts_with(&format!("{e}/")))
        };
        files
            .into_iter()
            .filter(|(path, m)| !is_excluded(path) && !m.whole_file_is_test)
            .map(|(path, masked)| Self {
                module: module_path(&path),
                path,
                masked,
            })
            .collect()
    }

    /// Where `offset` of this file is.
    pub(super) fn site(&self, offset: usize) -> Site {
        Site {
            file: self.path.clone(),
            line: self.masked.line_of(offset),
        }
    }

    /// The module at `offset`: the file's, and the inline modules around it.
    fn scope(&self, offset: usize) -> Vec<String> {
        let inline = self.masked.inline_mods.iter();
        let around = inline.filter(|(_, body)| body.contains(&offset));
        let mut scope = self.module.clone();
        scope.extend(around.map(|(name, _)| name.clone()));
        scope
    }

    /// Every path the text names from a module, made absolute, with the
    /// offset where it starts: `crate::a::b`, `super::x` (as many `super`
    /// as written), `self::x`, and `x::..` for a child `mod x;` of the
    /// file; each item of a `use` group is a path of its own
    /// (`crate::a::{b, c::{D, E}}` names `a::b`, `a::c::D` and `a::c::E`).
    pub(super) fn named_paths(&self) -> Vec<(Vec<String>, usize)> {
        let r = &self.masked.refs;
        let mut out = Vec::new();
        let mut i = 0;
        while i < r.len() {
            if !is_ident(r[i]) || (i > 0 && (is_ident(r[i - 1]) || r[i - 1] == b':')) {
                i += 1;
                continue;
            }
            let word = word_at(r, i);
            let start = i;
            i += word.len().max(1);
            let (base, tree_at) = match word {
                b"crate" => (Vec::new(), i + 2),
                b"self" => (self.scope(start), i + 2),
                b"super" => {
                    let mut supers = 1;
                    while r[i..].starts_with(b"::super")
                        && !r.get(i + 7).is_some_and(|b| is_ident(*b))
                    {
                        supers += 1;
                        i += 7;
                    }
                    let mut scope = self.scope(start);
                    let Some(kept) = scope.len().checked_sub(supers) else {
                        continue;
                    };
                    scope.truncate(kept);
                    (scope, i + 2)
                }
                w if self.masked.child_mods.iter().any(|c| c.as_bytes() == w) => {
                    (self.module.clone(), start)
                }
                _ => continue,
            };
            if !r[i..].starts_with(b"::") {
                continue;
            }
            let mut leaves = Vec::new();
            i = path_tree(r, tree_at, base, &mut leaves).max(i);
            out.extend(leaves.into_iter().map(|path| (path, start)));
        }
        out
    }
}

/// Reads the path (or `use` tree) at `at` below `prefix`: `a::b::C`,
/// `a::{b, c::{D, E}}`, `a::*`, `a::{self, B}`; pushes the full path of
/// each leaf and returns where the tree ends.
fn path_tree(r: &[u8], at: usize, mut prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    let mut i = skip_ws(r, at);
    loop {
        if r.get(i) == Some(&b'{') {
            let end = group_end(r, i);
            let close = end.saturating_sub(1);
            let mut j = i + 1;
            loop {
                j = skip_ws(r, j);
                if j >= close {
                    return end;
                }
                let mut k = path_tree(r, j, prefix.clone(), out);
                while k < close && r[k] != b',' {
                    k = if matches!(r[k], b'{' | b'(' | b'[') {
                        group_end(r, k)
                    } else {
                        k + 1
                    };
                }
                j = k + 1;
            }
        }
        let word = word_at(r, i);
        if word.is_empty() {
            out.push(prefix);
            return i;
        }
        if word != b"self" {
            prefix.push(String::from_utf8_lossy(word).into_owned());
        }
        i += word.len();
        if !r[i..].starts_with(b"::") {
            out.push(prefix);
            return i;
        }
        i = skip_ws(r, i + 2);
    }
}

/// The directory (with a trailing `/`, or empty for `src/`) where the file's
/// `mod name;` children live.
fn child_dir(path: &str) -> String {
    match path.rsplit_once('/') {
        None if matches!(path, "lib.rs" | "main.rs") => String::new(),
        Some((dir, "mod.rs")) => format!("{dir}/"),
        _ => format!("{}/", path.strip_suffix(".rs").unwrap_or(path)),
    }
}

/// The module a file holds (see [`SourceFile::module`]).
fn module_path(path: &str) -> Vec<String> {
    let mut parts: Vec<String> = path.split('/').map(str::to_string).collect();
    let last = parts.pop().unwrap_or_default();
    match last.as_str() {
        "mod.rs" => {}
        "lib.rs" | "main.rs" if parts.is_empty() => {}
        _ => parts.push(last.strip_suffix(".rs").unwrap_or(&last).to_string()),
    }
    parts
}

/// One file in two views with the same byte offsets: `code` with every
/// comment and literal blanked (to find items and braces), `refs` keeping
/// doc comments (intra-doc links name paths as code does); both with
/// `#[cfg(test)]` items blanked.
struct Masked {
    code: Vec<u8>,
    refs: Vec<u8>,
    /// `#[cfg(test)] mod name;` declarations.
    test_mods: Vec<String>,
    /// `#![cfg(test)]`: the whole file is a test module.
    whole_file_is_test: bool,
    /// Inline `mod name { .. }` bodies, which make `super` one deeper.
    inline_mods: Vec<(String, Range<usize>)>,
    /// The other `mod name;` declarations: the file's child modules.
    child_mods: Vec<String>,
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn blank(v: &mut [u8], range: Range<usize>) {
    for b in &mut v[range] {
        if *b != b'\n' {
            *b = b' ';
        }
    }
}

/// The end (exclusive) of the brace/bracket/paren group opening at `open`.
fn group_end(code: &[u8], open: usize) -> usize {
    let mut depth = 0usize;
    for (i, b) in code.iter().enumerate().skip(open) {
        match b {
            b'{' | b'[' | b'(' => depth += 1,
            b'}' | b']' | b')' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    code.len()
}

fn skip_ws(code: &[u8], mut i: usize) -> usize {
    while code.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    i
}

fn word_at(code: &[u8], i: usize) -> &[u8] {
    let end = (i..code.len())
        .find(|&j| !is_ident(code[j]))
        .unwrap_or(code.len());
    &code[i..end]
}

impl Masked {
    fn new(text: &str) -> Self {
        let (code, refs) = mask_literals(text.as_bytes());
        let mut m = Masked {
            code,
            refs,
            test_mods: Vec::new(),
            whole_file_is_test: false,
            inline_mods: Vec::new(),
            child_mods: Vec::new(),
        };
        m.mask_test_items();
        m.find_mods();
        m
    }

    fn line_of(&self, offset: usize) -> usize {
        1 + self.code[..offset].iter().filter(|b| **b == b'\n').count()
    }

    /// Blanks every `#[cfg(test)]` item and records `#[cfg(test)] mod x;`.
    fn mask_test_items(&mut self) {
        let mut i = 0;
        while i < self.code.len() {
            let inner = self.code[i..].starts_with(b"#![");
            if !(inner || self.code[i..].starts_with(b"#[")) {
                i += 1;
                continue;
            }
            let open = if inner { i + 2 } else { i + 1 };
            let close = group_end(&self.code, open);
            let attr: Vec<u8> = self.code[open + 1..close.saturating_sub(1)]
                .iter()
                .copied()
                .filter(|b| !b.is_ascii_whitespace())
                .collect();
            if attr != b"cfg(test)" {
                i = close;
                continue;
            }
            if inner {
                self.whole_file_is_test = true;
                return;
            }
            let end = self.item_end(close);
            if let Some(name) = self.out_of_line_mod(close, end) {
                self.test_mods.push(name);
            }
            blank(&mut self.code, i..end);
            blank(&mut self.refs, i..end);
            i = end;
        }
    }

    /// Where the item after its attributes (from `from`) ends: after its
    /// `;` or its `{ .. }` body, or before the `}` closing what holds it.
    fn item_end(&self, from: usize) -> usize {
        let mut i = from;
        while i < self.code.len() {
            match self.code[i] {
                b'(' | b'[' => i = group_end(&self.code, i),
                b';' => return i + 1,
                b'{' => return group_end(&self.code, i),
                b'}' => return i,
                _ => i += 1,
            }
        }
        self.code.len()
    }

    /// `name` when the item in `from..end` is `[pub(..)] mod name;`.
    fn out_of_line_mod(&self, from: usize, end: usize) -> Option<String> {
        if self.code.get(end.checked_sub(1)?) != Some(&b';') {
            return None;
        }
        let mut i = skip_ws(&self.code, from);
        while self.code[i..].starts_with(b"#[") {
            i = skip_ws(&self.code, group_end(&self.code, i + 1));
        }
        if word_at(&self.code, i) == b"pub" {
            i = skip_ws(&self.code, i + 3);
            if self.code.get(i) == Some(&b'(') {
                i = skip_ws(&self.code, group_end(&self.code, i));
            }
        }
        if word_at(&self.code, i) != b"mod" {
            return None;
        }
        i = skip_ws(&self.code, i + 3);
        let name = word_at(&self.code, i);
        (!name.is_empty()).then(|| String::from_utf8_lossy(name).into_owned())
    }

    /// Records the inline `mod name { .. }` bodies and the (non-test)
    /// `mod name;` declarations.
    fn find_mods(&mut self) {
        let mut i = 0;
        while let Some(at) = find(&self.code, b"mod", i) {
            i = at + 3;
            if (at > 0 && is_ident(self.code[at - 1]))
                || self.code.get(i).is_some_and(|b| is_ident(*b))
            {
                continue;
            }
            let name_at = skip_ws(&self.code, i);
            let name = word_at(&self.code, name_at);
            if name.is_empty() {
                continue;
            }
            let owned = String::from_utf8_lossy(name).into_owned();
            let after = skip_ws(&self.code, name_at + name.len());
            match self.code.get(after) {
                Some(b'{') => self
                    .inline_mods
                    .push((owned, after..group_end(&self.code, after))),
                Some(b';') => self.child_mods.push(owned),
                _ => {}
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// Blanks comments, string and char literals in `code`; in `refs` blanks
/// the same except doc comments (`///`, `//!`, `/** */`, `/*! */`).
fn mask_literals(b: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut code = b.to_vec();
    let mut refs = b.to_vec();
    let at = |i: usize| b.get(i).copied();
    let mut i = 0;
    while i < b.len() {
        let (end, doc) = match b[i] {
            b'/' if at(i + 1) == Some(b'/') => {
                let end = find(b, b"\n", i).unwrap_or(b.len());
                let doc =
                    (at(i + 2) == Some(b'/') && at(i + 3) != Some(b'/')) || at(i + 2) == Some(b'!');
                (end, doc)
            }
            b'/' if at(i + 1) == Some(b'*') => {
                let mut depth = 0usize;
                let mut j = i;
                while j < b.len() {
                    if b[j..].starts_with(b"/*") {
                        depth += 1;
                        j += 2;
                    } else if b[j..].starts_with(b"*/") {
                        depth -= 1;
                        j += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        j += 1;
                    }
                }
                let doc = (at(i + 2) == Some(b'*') && !matches!(at(i + 3), Some(b'*' | b'/')))
                    || at(i + 2) == Some(b'!');
                (j, doc)
            }
            b'"' => (string_end(b, i + 1), false),
            b'r' if raw_string_may_start(b, i) => match raw_string_end(b, i + 1) {
                Some(end) => (end, false),
                None => {
                    i += 1;
                    continue;
                }
            },
            b'\'' => match char_literal_end(b, i) {
                Some(end) => (end, false),
                None => {
                    i += 1;
                    continue;
                }
            },
            _ => {
                i += 1;
                continue;
            }
        };
        blank(&mut code, i..end);
        if !doc {
            blank(&mut refs, i..end);
        }
        i = end.max(i + 1);
    }
    (code, refs)
}

/// After the opening `"` at `from - 1`: the end of the string.
fn string_end(b: &[u8], from: usize) -> usize {
    let mut j = from;
    while j < b.len() {
        match b[j] {
            b'\\' => j += 2,
            b'"' => return j + 1,
            _ => j += 1,
        }
    }
    b.len()
}

/// `r` at `i` starts a raw string only as a word start (`r"`, `br"`).
fn raw_string_may_start(b: &[u8], i: usize) -> bool {
    let before = |k: usize| k > 0 && is_ident(b[k - 1]);
    !before(i) || (b[i - 1] == b'b' && !before(i - 1))
}

/// From after the `r`: the end of `#*"..."#*`, `None` if no raw string.
fn raw_string_end(b: &[u8], from: usize) -> Option<usize> {
    let hashes = b[from..].iter().take_while(|c| **c == b'#').count();
    if b.get(from + hashes) != Some(&b'"') {
        return None;
    }
    let mut close = vec![b'"'];
    close.extend(std::iter::repeat_n(b'#', hashes));
    Some(find(b, &close, from + hashes + 1).map_or(b.len(), |p| p + close.len()))
}

/// The end of the char literal at `i`, `None` for a lifetime or label.
fn char_literal_end(b: &[u8], i: usize) -> Option<usize> {
    if b.get(i + 1) == Some(&b'\\') {
        // The escaped character, then anything up to the closing quote
        // (`'\u{1F600}'`).
        return Some(find(b, b"'", i + 3).map_or(b.len(), |p| p + 1));
    }
    let first = *b.get(i + 1)?;
    let width = match first {
        0x00..=0x7F => 1,
        0xC0..=0xDF => 2,
        0xE0..=0xEF => 3,
        _ => 4,
    };
    (b.get(i + 1 + width) == Some(&b'\'')).then_some(i + 2 + width)
}
