//! The graph of a crate's top-level modules, and the graph of its files,
//! read from its `src/`, so a test can keep data flowing one way: no cycle
//! among the top-level modules, no module below a layer referring to it,
//! and no two files of a folder reaching each other ([`FileGraph`]).
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

mod files;
mod masked;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::path::Path;

pub use files::{Circle, FileGraph};
use masked::SourceFile;

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
    /// The referring module (or file).
    pub from: String,
    /// The referenced module (or file).
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
    /// A check skips a path no file of the crate is at.
    #[error(
        "no file of the crate is at src/{prefix} (a file or a folder); fix or drop the skip in the check"
    )]
    UnknownSkip {
        /// The path skipped, relative to `src/`.
        prefix: String,
    },
    /// Top-level modules reference each other in cycles.
    #[error(
        "top-level modules reference each other in a cycle; move what closes it (the reference that points up) below both ends:\n{}",
        show_cycles(.0)
    )]
    Cycles(Vec<Cycle>),
    /// Files reference each other in circles.
    #[error(
        "files reference each other in a circle; move the part both need into a file below them, or the part that reaches back up above them:\n{}",
        show_circles(.0)
    )]
    FileCircles(Vec<Circle>),
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

fn show_circles(circles: &[Circle]) -> String {
    circles.iter().map(ToString::to_string).collect()
}

/// Named nodes and, for each, the nodes it references with every place.
#[derive(Debug, Clone, Default)]
struct Digraph {
    nodes: BTreeSet<String>,
    /// node -> referenced node -> every place it is named.
    edges: BTreeMap<String, BTreeMap<String, Vec<Site>>>,
}

impl Digraph {
    fn add(&mut self, from: &str, to: &str, site: Site) {
        self.edges
            .entry(from.to_string())
            .or_default()
            .entry(to.to_string())
            .or_default()
            .push(site);
    }

    fn references(&self, node: &str) -> Vec<&str> {
        self.edges
            .get(node)
            .map(|t| t.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }

    fn hop(&self, from: &str, to: &str) -> Option<Hop> {
        let site = self.edges.get(from)?.get(to)?.first()?.clone();
        Some(Hop {
            from: from.to_string(),
            to: to.to_string(),
            site,
        })
    }

    /// Each group of nodes that reach each other (each strongly connected
    /// component of more than one node).
    fn cycles(&self) -> Vec<Cycle> {
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

    /// Tarjan's strongly connected components.
    fn components(&self) -> Vec<Vec<String>> {
        struct State<'g> {
            graph: &'g Digraph,
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
        for m in &self.nodes {
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

/// The top-level modules of a crate and which of them each references.
#[derive(Debug, Clone, Default)]
pub struct ModuleGraph {
    graph: Digraph,
}

impl ModuleGraph {
    /// Reads every `.rs` file under `src` (a crate's `src/` directory).
    pub fn read(src: &Path) -> Result<Self, GraphError> {
        Ok(Self::from_files(read_sources(src)?))
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
        if self.graph.nodes.contains(name) {
            Ok(())
        } else {
            Err(GraphError::UnknownModule {
                name: name.to_string(),
                known: self.modules().collect::<Vec<_>>().join(", "),
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
        let files: Vec<(String, SourceFile)> = SourceFile::select(files)
            .into_iter()
            .filter_map(|f| Some((f.module.first()?.clone(), f)))
            .collect();
        let mut graph = Digraph {
            nodes: files.iter().map(|(top, _)| top.clone()).collect(),
            edges: BTreeMap::new(),
        };
        for (top, file) in &files {
            for (path, offset) in file.named_paths() {
                let Some(target) = path.first() else { continue };
                if target == top || !graph.nodes.contains(target) {
                    continue;
                }
                graph.add(top, target, file.site(offset));
            }
        }
        Self { graph }
    }

    /// The top-level modules, by name.
    pub fn modules(&self) -> impl Iterator<Item = &str> {
        self.graph.nodes.iter().map(String::as_str)
    }

    /// The modules `module` references.
    pub fn references(&self, module: &str) -> Vec<&str> {
        self.graph.references(module)
    }

    /// Each group of modules that reach each other (each strongly
    /// connected component of more than one module).
    pub fn cycles(&self) -> Vec<Cycle> {
        self.graph.cycles()
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
        let hops: Vec<Hop> = modules
            .iter()
            .filter_map(|m| self.graph.hop(m, target))
            .collect();
        if hops.is_empty() {
            Ok(())
        } else {
            Err(GraphError::Referenced {
                target: target.to_string(),
                hops,
            })
        }
    }
}

/// Every `.rs` file under `src` as `(path relative to src/, text)`.
fn read_sources(src: &Path) -> Result<Vec<(String, String)>, GraphError> {
    let mut files = Vec::new();
    collect_files(src, "", &mut files)?;
    Ok(files)
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
