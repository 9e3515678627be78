//! The graph of a crate's files: which file names an item of which, so a
//! test can keep every folder one way (no two files reaching each other).
//!
//! Every non-test `.rs` file under `src/` is a node (the crate roots and
//! `bin/` are not). A file references another where it names a path that
//! resolves to it: the deepest file holding a prefix of the path
//! (`crate::a::b::c` is `a/b/c.rs` if there is one, else `a/b.rs`, else
//! `a.rs`, and the `mod.rs` forms alike), whether written from the crate
//! root, through `super::` or `self::`, or from a child `mod x;` of the
//! file, and every item of a `use` group. A reference to an ancestor
//! (`xds/cds/policy.rs` naming `xds/cds.rs` or `xds.rs`) is no edge: a
//! folder's parent file is the face of the room its children are in, and
//! they may use what it holds; the parent naming a child is an edge.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use super::masked::SourceFile;
use super::{Digraph, GraphError, Hop};

/// Files that reach each other (a strongly connected component of the
/// file graph), with every reference between them: one of them must go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Circle {
    /// The files, relative to `src/`.
    pub files: Vec<String>,
    /// Every reference from one of the files to another (the first place).
    pub hops: Vec<Hop>,
}

impl fmt::Display for Circle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let files: Vec<String> = self.files.iter().map(|f| format!("src/{f}")).collect();
        writeln!(f, "{} reach each other:", files.join(", "))?;
        for hop in &self.hops {
            writeln!(f, "  {} names src/{}", hop.site, hop.to)?;
        }
        Ok(())
    }
}

/// The files of a crate and which of them each references.
#[derive(Debug, Clone, Default)]
pub struct FileGraph {
    graph: Digraph,
}

impl FileGraph {
    /// Reads every `.rs` file under `src` (a crate's `src/` directory).
    pub fn read(src: &Path) -> Result<Self, GraphError> {
        Ok(Self::from_files(super::read_sources(src)?))
    }

    /// Reads the crate at `manifest_dir` (its `CARGO_MANIFEST_DIR`).
    pub fn read_crate(manifest_dir: &str) -> Result<Self, GraphError> {
        Self::read(&Path::new(manifest_dir).join("src"))
    }

    /// Builds the graph from `(path relative to src/, text)` pairs, with `/`
    /// separators (`lib.rs`, `xds.rs`, `xds/cache.rs`).
    pub fn from_files<I, P, T>(files: I) -> Self
    where
        I: IntoIterator<Item = (P, T)>,
        P: AsRef<str>,
        T: AsRef<str>,
    {
        let files: Vec<SourceFile> = SourceFile::select(files)
            .into_iter()
            .filter(|f| !f.module.is_empty())
            .collect();
        let by_module: BTreeMap<&[String], &str> = files
            .iter()
            .map(|f| (f.module.as_slice(), f.path.as_str()))
            .collect();
        let mut graph = Digraph {
            nodes: files.iter().map(|f| f.path.clone()).collect(),
            edges: BTreeMap::new(),
        };
        for file in &files {
            for (path, offset) in file.named_paths() {
                let Some((held, target)) = (1..=path.len())
                    .rev()
                    .find_map(|n| Some((&path[..n], *by_module.get(&path[..n])?)))
                else {
                    continue;
                };
                // The file itself, or an ancestor: the same room.
                if file.module.starts_with(held) {
                    continue;
                }
                graph.add(&file.path, target, file.site(offset));
            }
        }
        Self { graph }
    }

    /// The files, relative to `src/`.
    pub fn files(&self) -> impl Iterator<Item = &str> {
        self.graph.nodes.iter().map(String::as_str)
    }

    /// The files `file` references.
    pub fn references(&self, file: &str) -> Vec<&str> {
        self.graph.references(file)
    }

    /// Each group of files that reach each other, leaving out the files
    /// under each of `skip` (paths relative to `src/`: `xds` is `xds.rs`,
    /// `xds/mod.rs` and everything under `xds/`).
    pub fn circles(&self, skip: &[&str]) -> Vec<Circle> {
        let skipped = |file: &str| skip.iter().any(|s| is_under(file, s));
        let mut kept = self.graph.clone();
        kept.nodes.retain(|f| !skipped(f));
        kept.edges.retain(|f, _| !skipped(f));
        for targets in kept.edges.values_mut() {
            targets.retain(|t, _| !skipped(t));
        }
        kept.cycles()
            .into_iter()
            .map(|c| Circle {
                files: c.modules,
                hops: c.hops,
            })
            .collect()
    }

    /// Fails listing every circle among the files outside `skip` (see
    /// [`FileGraph::circles`]), or naming a `skip` no file is under.
    pub fn check_no_file_circles(&self, skip: &[&str]) -> Result<(), GraphError> {
        if let Some(prefix) = skip
            .iter()
            .find(|s| !self.graph.nodes.iter().any(|f| is_under(f, s)))
        {
            return Err(GraphError::UnknownSkip {
                prefix: prefix.to_string(),
            });
        }
        let circles = self.circles(skip);
        if circles.is_empty() {
            Ok(())
        } else {
            Err(GraphError::FileCircles(circles))
        }
    }
}

/// Whether `file` is the file or under the folder `prefix` names.
fn is_under(file: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    file == format!("{prefix}.rs")
        || file
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(files: &[(&str, &str)]) -> FileGraph {
        FileGraph::from_files(files.iter().copied())
    }

    #[test]
    fn a_circle_is_found_with_every_hop() {
        let g = graph(&[
            ("lib.rs", "pub mod inject;"),
            ("inject.rs", "mod template;\nmod sidecar;\nmod grpc;\n"),
            (
                "inject/template.rs",
                "use super::sidecar;\nfn f() { sidecar::render(); }\n",
            ),
            (
                "inject/sidecar.rs",
                "\n\nuse crate::inject::template::Values;",
            ),
            ("inject/grpc.rs", "use super::template::Values;"),
        ]);
        let circles = g.circles(&[]);
        assert_eq!(circles.len(), 1);
        assert_eq!(
            circles[0].files,
            ["inject/sidecar.rs", "inject/template.rs"]
        );
        let err = g.check_no_file_circles(&[]).unwrap_err();
        let shown = err.to_string();
        assert!(
            shown.contains("  src/inject/sidecar.rs:3 names src/inject/template.rs\n"),
            "{shown}"
        );
        assert!(
            shown.contains("  src/inject/template.rs:1 names src/inject/sidecar.rs\n"),
            "{shown}"
        );
        assert!(matches!(err, GraphError::FileCircles(c) if c.len() == 1));
        assert!(g.check_no_file_circles(&["inject"]).is_ok());
        let err = g.check_no_file_circles(&["injetc"]).unwrap_err();
        assert!(
            matches!(&err, GraphError::UnknownSkip { prefix } if prefix == "injetc"),
            "{err}"
        );
    }

    #[test]
    fn a_child_naming_its_ancestors_is_no_edge() {
        let g = graph(&[
            ("xds.rs", "mod cds;\nuse cds::policy::Policy;\n"),
            ("xds/cds.rs", "pub mod policy;\nuse super::Server;\n"),
            (
                "xds/cds/policy.rs",
                "use super::super::Server;\nuse super::Cluster;\nuse crate::xds::cds::X;\n",
            ),
        ]);
        assert!(g.references("xds/cds/policy.rs").is_empty());
        assert!(g.references("xds/cds.rs").is_empty());
        assert_eq!(g.references("xds.rs"), ["xds/cds/policy.rs"]);
        assert!(g.circles(&[]).is_empty());
    }

    #[test]
    fn groups_self_and_child_paths_resolve_to_the_deepest_file() {
        let g = graph(&[
            (
                "model.rs",
                "pub mod a;\npub mod b;\npub mod c;\nmod d;\npub use a::f;\nuse self::c::deep;\n",
            ),
            (
                "model/a.rs",
                concat!(
                    "use crate::{\n    model::{b::{self, X}, c::deep::Y},\n    other,\n};\n",
                    "/// See [`Z`](super::d::Z).\n",
                    "fn f() {}\n",
                ),
            ),
            ("model/b.rs", "fn f() { self::inner::g(); }\nmod inner {}\n"),
            ("model/c.rs", "pub mod deep;"),
            ("model/c/deep/mod.rs", ""),
            ("model/d.rs", ""),
            ("model.rs.bak", "use crate::model::a;"),
            (
                "model/e.rs",
                "mod inner {\n    use super::super::b;\n    use self::x::Y;\n}\n",
            ),
            ("other.rs", "use crate::model::d;"),
        ]);
        assert_eq!(
            g.references("model/a.rs"),
            [
                "model/b.rs",
                "model/c/deep/mod.rs",
                "model/d.rs",
                "other.rs"
            ]
        );
        assert!(g.references("model/b.rs").is_empty());
        assert_eq!(g.references("model/e.rs"), ["model/b.rs"]);
        assert_eq!(
            g.references("model.rs"),
            ["model/a.rs", "model/c/deep/mod.rs"],
            "declaring `mod b;` is no reference"
        );
        assert!(!g.files().any(|f| f.ends_with(".bak")));
    }
}
