//! The graph of a crate's top-level modules, read from its `src/`, so a test
//! can keep data flowing one way: no cycle among the top-level modules, and
//! no module below a layer referring to it.
//!
//! A top-level module `a` references `b` where a file of `a` names
//! `crate::b` (a path, or one item of a `use crate::{b, c::X}` group), or
//! reaches `b` through as many `super::` as it is deep. Doc comments count
//! (rustdoc resolves their intra-doc links like code); plain comments and
//! string literals do not. Everything under `#[cfg(test)]` is left out: an
//! inline item, and the file of a `#[cfg(test)] mod name;` with everything
//! below it. The crate roots (`lib.rs`, `main.rs`) and `src/bin/` are not
//! modules of the graph.
//!
//! This reads the text, not the compiler's name resolution (no crate parses
//! Rust to resolved paths without building it): `#[path]` attributes,
//! glob re-exports at the crate root and paths made by macros are not
//! followed.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::ops::Range;
use std::path::Path;

/// Where a reference is written: a file (relative to `src/`) and line.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Site {
    /// The file, relative to `src/`, with `/` separators.
    pub file: String,
    /// The line, from 1.
    pub line: usize,
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "src/{}:{}", self.file, self.line)
    }
}

/// One reference of a cycle or a forbidden reference: `from` names `to` at `site`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    /// The referring module.
    pub from: String,
    /// The referenced module.
    pub to: String,
    /// The first place `from` names `to`.
    pub site: Site,
}

impl fmt::Display for Hop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} -> {} ({})", self.from, self.to, self.site)
    }
}

/// Modules that reach each other (a strongly connected component).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle {
    /// The modules, by name.
    pub modules: Vec<String>,
    /// The shortest cycle from the first module back to it.
    pub example: Vec<Hop>,
    /// Every reference between the modules: one of them must go.
    pub hops: Vec<Hop>,
}

impl fmt::Display for Cycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} reach each other, e.g.:", self.modules.join(", "))?;
        f.write_str(&show_hops(&self.example))?;
        writeln!(f, "every reference among them:")?;
        f.write_str(&show_hops(&self.hops))
    }
}

/// Why a graph could not be read, or a check failed.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    /// A file or directory under `src/` could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The path.
        path: String,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// A check names a module the crate does not have.
    #[error(
        "the crate has no top-level module {name:?} (it has: {known}); fix the name in the check"
    )]
    UnknownModule {
        /// The name asked for.
        name: String,
        /// The modules there are, comma-separated.
        known: String,
    },
    /// Top-level modules reference each other in cycles.
    #[error(
        "top-level modules reference each other in a cycle; move what closes it (the reference that points up) below both ends:\n{}",
        show_cycles(.0)
    )]
    Cycles(Vec<Cycle>),
    /// Modules that must not reference a module do.
    #[error(
        "modules below {target} must not reference it, but:\n{}",
        show_hops(.hops)
    )]
    Referenced {
        /// The module that must not be referenced.
        target: String,
        /// The references found.
        hops: Vec<Hop>,
    },
}

fn show_hops(hops: &[Hop]) -> String {
    hops.iter().map(|h| format!("  {h}\n")).collect()
}

fn show_cycles(cycles: &[Cycle]) -> String {
    cycles.iter().map(ToString::to_string).collect()
}

/// The top-level modules of a crate and which of them each references.
#[derive(Debug, Clone, Default)]
pub struct ModuleGraph {
    modules: BTreeSet<String>,
    /// module -> referenced module -> every place it is named.
    edges: BTreeMap<String, BTreeMap<String, Vec<Site>>>,
}

impl ModuleGraph {
    /// Reads every `.rs` file under `src` (a crate's `src/` directory).
    pub fn read(src: &Path) -> Result<Self, GraphError> {
        let mut files = Vec::new();
        collect_files(src, "", &mut files)?;
        Ok(Self::from_files(files))
    }

    /// Reads the crate at `manifest_dir` (its `CARGO_MANIFEST_DIR`) and
    /// checks that it has each of the `expected` top-level modules, so a
    /// check on a renamed module fails instead of passing on nothing.
    pub fn read_crate(manifest_dir: &str, expected: &[&str]) -> Result<Self, GraphError> {
        let graph = Self::read(&Path::new(manifest_dir).join("src"))?;
        for name in expected {
            graph.require(name)?;
        }
        Ok(graph)
    }

    /// Fails with [`GraphError::UnknownModule`] unless the crate has the
    /// top-level module `name`.
    fn require(&self, name: &str) -> Result<(), GraphError> {
        if self.modules.contains(name) {
            Ok(())
        } else {
            Err(GraphError::UnknownModule {
                name: name.to_string(),
                known: self.modules.iter().cloned().collect::<Vec<_>>().join(", "),
            })
        }
    }

    /// Builds the graph from `(path relative to src/, text)` pairs, with `/`
    /// separators (`lib.rs`, `xds.rs`, `xds/cache.rs`).
    pub fn from_files<I, P, T>(files: I) -> Self
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
        let files: Vec<(&str, &str, &Masked)> = files
            .iter()
            .filter(|(path, m)| !is_excluded(path) && !m.whole_file_is_test)
            .filter_map(|(path, m)| Some((path.as_str(), top_module(path)?, m)))
            .collect();
        let mut graph = Self {
            modules: files.iter().map(|(_, top, _)| top.to_string()).collect(),
            edges: BTreeMap::new(),
        };
        for (path, top, masked) in files {
            for (target, offset) in masked.references(file_depth(path)) {
                if target == top || !graph.modules.contains(&target) {
                    continue;
                }
                let site = Site {
                    file: path.to_string(),
                    line: masked.line_of(offset),
                };
                graph
                    .edges
                    .entry(top.to_string())
                    .or_default()
                    .entry(target)
                    .or_default()
                    .push(site);
            }
        }
        graph
    }

    /// The top-level modules, by name.
    pub fn modules(&self) -> impl Iterator<Item = &str> {
        self.modules.iter().map(String::as_str)
    }

    /// The modules `module` references.
    pub fn references(&self, module: &str) -> Vec<&str> {
        self.edges
            .get(module)
            .map(|t| t.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }

    /// Each group of modules that reach each other (each strongly
    /// connected component of more than one module).
    pub fn cycles(&self) -> Vec<Cycle> {
        self.components()
            .into_iter()
            .filter(|c| c.len() > 1)
            .map(|modules| {
                let hops = modules
                    .iter()
                    .flat_map(|a| modules.iter().filter_map(|b| self.hop(a, b)))
                    .collect();
                Cycle {
                    example: self.cycle_within(&modules).unwrap_or_default(),
                    hops,
                    modules,
                }
            })
            .collect()
    }

    /// Fails listing every cycle among the top-level modules.
    pub fn check_acyclic(&self) -> Result<(), GraphError> {
        let cycles = self.cycles();
        if cycles.is_empty() {
            Ok(())
        } else {
            Err(GraphError::Cycles(cycles))
        }
    }

    /// Fails if any of `modules` references `target` directly, listing
    /// where. Listing every module below `target` makes this "nothing below
    /// `target` depends on it": a path through a module not listed would go
    /// through one above it.
    pub fn check_not_referenced_by(
        &self,
        target: &str,
        modules: &[&str],
    ) -> Result<(), GraphError> {
        for name in std::iter::once(&target).chain(modules) {
            self.require(name)?;
        }
        let hops: Vec<Hop> = modules.iter().filter_map(|m| self.hop(m, target)).collect();
        if hops.is_empty() {
            Ok(())
        } else {
            Err(GraphError::Referenced {
                target: target.to_string(),
                hops,
            })
        }
    }

    fn hop(&self, from: &str, to: &str) -> Option<Hop> {
        let site = self.edges.get(from)?.get(to)?.first()?.clone();
        Some(Hop {
            from: from.to_string(),
            to: to.to_string(),
            site,
        })
    }

    /// Tarjan's strongly connected components.
    fn components(&self) -> Vec<Vec<String>> {
        struct State<'g> {
            graph: &'g ModuleGraph,
            next: usize,
            index: BTreeMap<&'g str, usize>,
            low: BTreeMap<&'g str, usize>,
            stack: Vec<&'g str>,
            on_stack: BTreeSet<&'g str>,
            out: Vec<Vec<String>>,
        }
        fn visit<'g>(s: &mut State<'g>, v: &'g str) {
            s.index.insert(v, s.next);
            s.low.insert(v, s.next);
            s.next += 1;
            s.stack.push(v);
            s.on_stack.insert(v);
            let graph = s.graph;
            for w in graph.references(v) {
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let lw = s.low[w];
                    let lv = s.low.entry(v).or_default();
                    *lv = (*lv).min(lw);
                } else if s.on_stack.contains(w) {
                    let iw = s.index[w];
                    let lv = s.low.entry(v).or_default();
                    *lv = (*lv).min(iw);
                }
            }
            if s.low[v] == s.index[v] {
                let mut component = Vec::new();
                while let Some(w) = s.stack.pop() {
                    s.on_stack.remove(w);
                    component.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                component.sort();
                s.out.push(component);
            }
        }
        let mut s = State {
            graph: self,
            next: 0,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            on_stack: BTreeSet::new(),
            out: Vec::new(),
        };
        for m in &self.modules {
            if !s.index.contains_key(m.as_str()) {
                visit(&mut s, m);
            }
        }
        s.out.sort();
        s.out
    }

    /// The shortest cycle from the first module of `component` back to it.
    fn cycle_within(&self, component: &[String]) -> Option<Vec<Hop>> {
        let start = component.first()?.as_str();
        let inside: BTreeSet<&str> = component.iter().map(String::as_str).collect();
        let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = VecDeque::from([start]);
        let mut last = None;
        'search: while let Some(v) = queue.pop_front() {
            for w in self.references(v) {
                if !inside.contains(w) {
                    continue;
                }
                if w == start {
                    last = Some(v);
                    break 'search;
                }
                if !came_from.contains_key(w) {
                    came_from.insert(w, v);
                    queue.push_back(w);
                }
            }
        }
        let mut path = vec![start];
        let mut v = last?;
        while v != start {
            path.push(v);
            v = *came_from.get(v)?;
        }
        path.push(start);
        path.reverse();
        path.windows(2).map(|w| self.hop(w[0], w[1])).collect()
    }
}

fn collect_files(dir: &Path, rel: &str, out: &mut Vec<(String, String)>) -> Result<(), GraphError> {
    let read_error = |path: &Path, source| GraphError::Read {
        path: path.display().to_string(),
        source,
    };
    let entries = std::fs::read_dir(dir).map_err(|e| read_error(dir, e))?;
    let mut entries: Vec<_> = entries
        .collect::<Result<_, _>>()
        .map_err(|e| read_error(dir, e))?;
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let rel = format!("{rel}{name}");
        if path.is_dir() {
            collect_files(&path, &format!("{rel}/"), out)?;
        } else if name.ends_with(".rs") {
            let text = std::fs::read_to_string(&path).map_err(|e| read_error(&path, e))?;
            out.push((rel, text));
        }
    }
    Ok(())
}

/// The top-level module a file belongs to; `None` for the crate roots.
fn top_module(path: &str) -> Option<&str> {
    if matches!(path, "lib.rs" | "main.rs") {
        return None;
    }
    let first = path.split('/').next()?;
    Some(first.strip_suffix(".rs").unwrap_or(first))
}

/// How deep the file's module is: `xds.rs` and `xds/mod.rs` are 1,
/// `xds/cache.rs` 2; the crate roots 0.
fn file_depth(path: &str) -> usize {
    let parts = path.split('/').count();
    match path.rsplit('/').next() {
        Some("mod.rs") => parts - 1,
        Some("lib.rs" | "main.rs") if parts == 1 => 0,
        _ => parts,
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
    inline_mods: Vec<Range<usize>>,
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
        };
        m.mask_test_items();
        m.find_inline_mods();
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

    fn find_inline_mods(&mut self) {
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
            let after = skip_ws(&self.code, name_at + name.len());
            if !name.is_empty() && self.code.get(after) == Some(&b'{') {
                self.inline_mods.push(after..group_end(&self.code, after));
            }
        }
    }

    /// Every top-level module name this file's text references, with the
    /// offset of the reference; `depth` is the file's module depth.
    fn references(&self, depth: usize) -> Vec<(String, usize)> {
        let r = &self.refs;
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
            let after_root = match word {
                b"crate" if r[i..].starts_with(b"::") => i + 2,
                b"super" => {
                    let mut supers = 1;
                    let mut j = i;
                    while r[j..].starts_with(b"::super")
                        && !r.get(j + 7).is_some_and(|b| is_ident(*b))
                    {
                        supers += 1;
                        j += 7;
                    }
                    let inline = self
                        .inline_mods
                        .iter()
                        .filter(|m| m.contains(&start))
                        .count();
                    if supers != depth + inline || !r[j..].starts_with(b"::") {
                        i = j;
                        continue;
                    }
                    j + 2
                }
                _ => continue,
            };
            let at = skip_ws(r, after_root);
            if r.get(at) == Some(&b'{') {
                for name in group_heads(r, at) {
                    out.push((name, start));
                }
            } else {
                let name = word_at(r, at);
                if !name.is_empty() {
                    out.push((String::from_utf8_lossy(name).into_owned(), start));
                }
            }
            i = at;
        }
        out
    }
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

/// The first name of each item of the `{a, b::c, d::{e}}` group at `open`.
fn group_heads(r: &[u8], open: usize) -> Vec<String> {
    let end = group_end(r, open);
    let mut heads = Vec::new();
    let mut i = open + 1;
    let mut expect_head = true;
    while i < end.saturating_sub(1) {
        match r[i] {
            b'{' | b'(' | b'[' => {
                i = group_end(r, i);
                continue;
            }
            b',' => expect_head = true,
            b if expect_head && is_ident(b) => {
                let name = word_at(r, i);
                if name != b"self" {
                    heads.push(String::from_utf8_lossy(name).into_owned());
                }
                expect_head = false;
                i += name.len();
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    heads
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_crate_reads_src_and_requires_the_expected_modules() {
        let dir = env!("CARGO_MANIFEST_DIR");
        let graph = ModuleGraph::read_crate(dir, &["module_graph", "tls"]).unwrap();
        assert!(graph.modules().any(|m| m == "module_graph"));
        let err = ModuleGraph::read_crate(dir, &["no_such_module"]).unwrap_err();
        assert!(
            matches!(&err, GraphError::UnknownModule { name, .. } if name == "no_such_module"),
            "{err}"
        );
    }

    fn graph(files: &[(&str, &str)]) -> ModuleGraph {
        ModuleGraph::from_files(files.iter().copied())
    }

    #[test]
    fn paths_and_use_groups_are_references() {
        let g = graph(&[
            (
                "lib.rs",
                "pub mod a; pub mod b; pub mod c; pub mod d; pub mod e;",
            ),
            (
                "a.rs",
                "use crate::{\n    b,\n    c::{X, Y},\n    self,\n};\nfn f() { crate::d::g(); }\npub(crate) fn h() {}\n",
            ),
            ("b.rs", ""),
            ("c.rs", ""),
            ("d.rs", ""),
            ("e.rs", "use crate::VERSION;\nuse crate::e::x;\n"),
        ]);
        assert_eq!(g.references("a"), ["b", "c", "d"]);
        assert!(
            g.references("e").is_empty(),
            "the root and itself are no edges"
        );
        assert_eq!(g.modules().collect::<Vec<_>>(), ["a", "b", "c", "d", "e"]);
    }

    #[test]
    fn supers_reaching_the_root_are_references() {
        let g = graph(&[
            ("a.rs", "use super::b::X;"),
            ("a/x.rs", "use super::super::{c, d};\nuse super::y;\n"),
            (
                "a/y.rs",
                "mod inner {\n    use super::super::super::e;\n}\n",
            ),
            ("b.rs", ""),
            ("c.rs", ""),
            ("d.rs", ""),
            ("e.rs", ""),
        ]);
        assert_eq!(g.references("a"), ["b", "c", "d", "e"]);
    }

    #[test]
    fn tests_comments_and_strings_are_not_references() {
        let g = graph(&[
            (
                "a.rs",
                concat!(
                    "//! Links count: [`B`](crate::b::B).\n",
                    "// crate::c is only mentioned.\n",
                    "/* crate::c /* nested */ crate::c */\n",
                    "const S: &str = \"crate::c\";\n",
                    "const R: &str = r#\"crate::c \"# ;\n",
                    "const C: char = '{';\n",
                    "fn f<'a>(x: &'a str) -> &'a str { x }\n",
                    "#[cfg(test)]\nuse crate::c;\n",
                    "#[cfg(test)]\n#[allow(dead_code)]\nfn helper() { let _ = '}'; crate::c::f(); }\n",
                    "#[cfg(test)]\nmod tests {\n    use crate::c;\n    #[test]\n    fn t() { let _ = \"}\"; }\n}\n",
                    "#[cfg(test)]\npub(crate) mod fakes;\n",
                    "fn g() { crate::d::h(); }\n",
                ),
            ),
            ("a/fakes.rs", "use crate::c;"),
            ("a/fakes/more.rs", "use crate::c;"),
            ("b.rs", "mod only_tests;"),
            ("b/only_tests.rs", "#![cfg(test)]\nuse crate::c;"),
            ("c.rs", ""),
            ("d.rs", ""),
        ]);
        assert_eq!(g.references("a"), ["b", "d"]);
        assert!(g.references("b").is_empty());
    }

    #[test]
    fn a_root_test_module_is_left_out() {
        let g = graph(&[
            ("lib.rs", "pub mod a;\n#[cfg(test)]\nmod testing;\n"),
            ("a.rs", ""),
            ("testing.rs", "use crate::a;"),
        ]);
        assert_eq!(g.modules().collect::<Vec<_>>(), ["a"]);
    }

    #[test]
    fn cycles_are_listed_with_where_they_close() {
        let g = graph(&[
            ("a.rs", "use crate::b;"),
            ("b.rs", "\nuse crate::c;"),
            ("c.rs", "\n\nfn f() { crate::a::g(); }"),
            ("d.rs", "use crate::a;"),
        ]);
        let cycles = g.cycles();
        assert_eq!(cycles.len(), 1);
        assert_eq!(cycles[0].modules, ["a", "b", "c"]);
        assert_eq!(cycles[0].hops.len(), 3);
        let hops: Vec<String> = cycles[0].example.iter().map(ToString::to_string).collect();
        assert_eq!(
            hops,
            [
                "a -> b (src/a.rs:1)",
                "b -> c (src/b.rs:2)",
                "c -> a (src/c.rs:3)"
            ]
        );
        let err = g.check_acyclic().unwrap_err().to_string();
        assert!(err.contains("c -> a (src/c.rs:3)"), "{err}");
        assert!(
            graph(&[("a.rs", "use crate::b;"), ("b.rs", "")])
                .check_acyclic()
                .is_ok()
        );
    }

    #[test]
    fn forbidden_references_are_listed() {
        let g = graph(&[
            ("app.rs", "use crate::status;"),
            ("status.rs", "use crate::envoy;"),
            ("envoy.rs", ""),
            ("dns.rs", "fn f() { crate::status::x(); }"),
        ]);
        assert!(g.check_not_referenced_by("status", &["envoy"]).is_ok());
        let err = g
            .check_not_referenced_by("status", &["envoy", "dns"])
            .unwrap_err();
        assert!(
            matches!(&err, GraphError::Referenced { hops, .. } if hops.len() == 1 && hops[0].from == "dns"),
            "{err}"
        );
        let err = g.check_not_referenced_by("status", &["dsn"]).unwrap_err();
        assert!(
            err.to_string().contains("no top-level module \"dsn\""),
            "{err}"
        );
    }

    #[test]
    fn reads_a_directory() {
        let dir = std::env::temp_dir().join(format!("module-graph-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("a")).unwrap();
        std::fs::write(dir.join("lib.rs"), "pub mod a; pub mod b;").unwrap();
        std::fs::write(dir.join("a.rs"), "mod x;").unwrap();
        std::fs::write(dir.join("a/x.rs"), "use crate::b;").unwrap();
        std::fs::write(dir.join("b.rs"), "").unwrap();
        let g = ModuleGraph::read(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(g.references("a"), ["b"]);
        assert!(matches!(
            ModuleGraph::read(&dir),
            Err(GraphError::Read { .. })
        ));
    }
}
