//! The crate's modules import one way: no two sibling modules (or the subtrees under them)
//! import each other, directly or round a longer circle. A module and its own children may
//! (`store` re-exports what `store::sql` uses). docs/ARCHITECTURE.md states the rule; this
//! keeps it true.
//!
//! The graph is read from the source as a newcomer would read it: every `use crate::…`,
//! `use super::…` and inline `crate::…` path names the deepest module it reaches, and an item
//! that module re-exports by name (`pub use sub::Item;`) is followed to the module it comes
//! from, so that a re-export does not hide an import (a glob, `pub use sub::*`, is not
//! followed). Test modules (`#[cfg(test)]`) and comments are left out: tests may reach
//! anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Module = Vec<String>;

#[test]
fn no_two_sibling_modules_import_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = read_modules(&src);
    let known: BTreeSet<Module> = modules.keys().cloned().collect();
    let reexports: BTreeMap<Module, Reexports> = modules
        .iter()
        .map(|(module, text)| (module.clone(), reexports_in(&code_only(text))))
        .collect();
    let edges = edges_of(&modules, &known, &reexports);
    let circles = sibling_circles(&known, &edges);
    assert!(
        circles.is_empty(),
        "import circles among sibling modules (each line: the parent, then the circle):\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_reader_sees_a_circle_when_there_is_one() {
    let known: BTreeSet<Module> = [vec!["a"], vec!["b"], vec!["b", "c"], vec!["d"]]
        .into_iter()
        .map(|m| m.into_iter().map(String::from).collect())
        .collect();
    let text_a = "use crate::b::c::Thing;\n#[cfg(test)]\nmod tests { use crate::d::X; }";
    let text_c = "// crate::d is only mentioned\nfn f() { super::super::a::g(); }";
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (module, text) in [(vec!["a"], text_a), (vec!["b", "c"], text_c)] {
        let module: Module = module.into_iter().map(String::from).collect();
        for path in paths_in(&code_only(text)) {
            if let Some(target) = resolve(&module, &path, &known) {
                edges.entry(module.clone()).or_default().insert(target);
            }
        }
    }
    assert_eq!(sibling_circles(&known, &edges), ["crate: a ↔ b"]);
    let grouped = paths_in("use crate::{x::{y, z as w}, v};");
    let expected: Vec<Vec<&str>> = vec![
        vec!["crate", "x", "y"],
        vec!["crate", "x", "z"],
        vec!["crate", "v"],
    ];
    assert_eq!(grouped, expected);
}

#[test]
fn an_import_through_a_re_export_counts_against_the_module_it_comes_from() {
    let module = |m: &[&str]| -> Module { m.iter().map(|s| s.to_string()).collect() };
    let known: BTreeSet<Module> = [module(&["p"]), module(&["p", "x"]), module(&["p", "y"])]
        .into_iter()
        .collect();
    // `p` re-exports `y`'s items; `x` takes one through `p`, `y` takes one from `x`.
    let sources = [
        (
            module(&["p"]),
            "pub use y::Thing;\npub(crate) use y::{Other as Renamed, self};",
        ),
        (
            module(&["p", "x"]),
            "use super::Thing;\nfn f() { crate::p::Renamed::new(); }",
        ),
        (module(&["p", "y"]), "use super::x::f;"),
    ];
    let reexports: BTreeMap<Module, Reexports> = sources
        .iter()
        .map(|(m, text)| (m.clone(), reexports_in(&code_only(text))))
        .collect();
    assert_eq!(reexports[&module(&["p"])].len(), 2, "{reexports:?}");
    let sources: BTreeMap<Module, String> = sources
        .into_iter()
        .map(|(m, text)| (m, text.to_string()))
        .collect();
    let edges = edges_of(&sources, &known, &reexports);
    assert_eq!(
        edges[&module(&["p", "x"])],
        [module(&["p", "y"])].into_iter().collect(),
        "both of x's imports reach y through p"
    );
    assert_eq!(sibling_circles(&known, &edges), ["p: x ↔ y"]);
}

/// Which modules each module's code imports from, re-exports followed; a module's imports of
/// itself left out.
fn edges_of(
    modules: &BTreeMap<Module, String>,
    known: &BTreeSet<Module>,
    reexports: &BTreeMap<Module, Reexports>,
) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (module, text) in modules {
        for path in paths_in(&code_only(text)) {
            if let Some(target) = follow(module, &path, known, reexports)
                && &target != module
            {
                edges.entry(module.clone()).or_default().insert(target);
            }
        }
    }
    edges
}

/// Every module of the crate by its path (`store::sql::round`), with its source.
fn read_modules(src: &Path) -> BTreeMap<Module, String> {
    let mut modules = BTreeMap::new();
    let mut pending = vec![src.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(src).unwrap().with_extension("");
            let mut module: Module = relative
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            if module == ["lib"] || module == ["main"] {
                continue;
            }
            if module.last().is_some_and(|last| last == "mod") {
                module.pop();
            }
            modules.insert(module, std::fs::read_to_string(&path).unwrap());
        }
    }
    modules
}

/// The source without comments, string literals and `#[cfg(test)]` items.
fn code_only(text: &str) -> String {
    let mut code = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        code.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                let mut last = ' ';
                for c in chars.by_ref() {
                    if last == '*' && c == '/' {
                        break;
                    }
                    last = c;
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if !escaped && c == '"' {
                        break;
                    }
                    escaped = !escaped && c == '\\';
                }
                code.push_str("\"\"");
            }
            _ => code.push(c),
        }
    }
    without_test_items(&code)
}

/// Drops each `#[cfg(test)]` item: up to its `;`, or its braces' end.
fn without_test_items(code: &str) -> String {
    let mut kept = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        kept.push_str(&rest[..at]);
        let item = &rest[at..];
        let brace = item.find('{').unwrap_or(item.len());
        let semicolon = item.find(';').unwrap_or(item.len());
        if semicolon < brace {
            rest = &item[semicolon + 1..];
            continue;
        }
        let mut depth = 0;
        let mut end = item.len();
        for (i, c) in item.char_indices().skip(brace) {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &item[end..];
    }
    kept.push_str(rest);
    kept
}

/// Every path the code names from `crate` or `super`: each leaf of a `use` tree, and each
/// inline `crate::a::b` or `super::a`.
fn paths_in(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let before = rest[..at].chars().last();
        let tail = &rest[at + 4..];
        let Some(end) = tail.find(';') else { break };
        if before.is_none_or(|c| !c.is_alphanumeric() && c != '_') {
            expand_use(&[], &tail[..end], &mut paths);
        }
        rest = &tail[end..];
    }
    let words: Vec<&str> = code
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .collect();
    for word in words {
        let path = segments(word);
        if path.len() > 1 && (path[0] == "crate" || path[0] == "super") {
            paths.push(path);
        }
    }
    paths
}

fn segments(path: &str) -> Vec<String> {
    path.split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.split_whitespace().next().unwrap_or(s).to_string())
        .collect()
}

/// The leaves of a `use` tree (`a::{b, c::{d}}`), each as a whole path.
fn expand_use(prefix: &[String], tree: &str, paths: &mut Vec<Vec<String>>) {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let mut path = prefix.to_vec();
        path.extend(segments(tree));
        paths.push(path);
        return;
    };
    let mut head = prefix.to_vec();
    head.extend(segments(&tree[..open]));
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                expand_use(&head, &inner[start..i], paths);
                start = i + 1;
            }
            _ => {}
        }
    }
    if !inner[start..].trim().is_empty() {
        expand_use(&head, &inner[start..], paths);
    }
}

/// What a module re-exports by name: the name it is known by there, and the path it was
/// taken from, as written in that module.
type Reexports = BTreeMap<String, Vec<String>>;

/// The leaves of every `pub use` (or `pub(…) use`) of `code` but globs.
fn reexports_in(code: &str) -> Reexports {
    let mut found = Reexports::new();
    let mut rest = code;
    while let Some(at) = rest.find("pub") {
        let tail = &rest[at + 3..];
        let before = rest[..at].chars().last();
        let visibility_end = if tail.starts_with('(') {
            tail.find(')').map_or(0, |i| i + 1)
        } else {
            0
        };
        let after = tail[visibility_end..].trim_start();
        rest = tail;
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') || !after.starts_with("use ") {
            continue;
        }
        let tree = &after[4..];
        let Some(end) = tree.find(';') else { break };
        let mut leaves = Vec::new();
        expand_use_named(&[], &tree[..end], &mut leaves);
        for (name, path) in leaves {
            if name != "*" && name != "self" {
                found.insert(name, path);
            }
        }
    }
    found
}

/// The leaves of a `use` tree with the name each is known by (its alias, if it has one).
fn expand_use_named(prefix: &[String], tree: &str, out: &mut Vec<(String, Vec<String>)>) {
    let mut paths = Vec::new();
    expand_use(prefix, tree, &mut paths);
    // The aliases, in the order of the leaves (`a as b` is the leaf `a`, named `b`).
    let mut aliases = tree
        .split([',', '{', '}'])
        .map(str::trim)
        .filter(|leaf| !leaf.is_empty());
    for path in paths {
        let last = path.last().cloned().unwrap_or_default();
        let name = aliases
            .by_ref()
            .find(|leaf| {
                let named = leaf
                    .split("::")
                    .last()
                    .and_then(|l| l.split_whitespace().next());
                named == Some(last.as_str())
            })
            .and_then(|leaf| leaf.split(" as ").nth(1))
            .map_or(last, |alias| alias.trim().to_string());
        out.push((name, path));
    }
}

/// The module `path` from `module` reaches, an item the reached module re-exports by name
/// followed to where it comes from (a few steps at most: re-exports do not chain far).
fn follow(
    module: &Module,
    path: &[String],
    known: &BTreeSet<Module>,
    reexports: &BTreeMap<Module, Reexports>,
) -> Option<Module> {
    let (mut from, mut path) = (module.clone(), path.to_vec());
    for _ in 0..4 {
        let full = absolute(&from, &path)?;
        let target = deepest_known(&full, known)?;
        let item = full.get(target.len());
        let Some(source) = item.and_then(|name| reexports.get(&target)?.get(name)) else {
            return Some(target);
        };
        if !matches!(
            source.first().map(String::as_str),
            Some("crate" | "super" | "self")
        ) {
            // Re-exported from a child named without a prefix (`pub use sub::Item`).
            path = ["self".to_string()]
                .into_iter()
                .chain(source.iter().cloned())
                .collect();
        } else {
            path = source.clone();
        }
        path.extend(full[target.len() + 1..].iter().cloned());
        from = target;
    }
    deepest_known(&absolute(&from, &path)?, known)
}

/// The deepest module of the crate a path from `module` reaches, if it is the crate's.
fn resolve(module: &Module, path: &[String], known: &BTreeSet<Module>) -> Option<Module> {
    deepest_known(&absolute(module, path)?, known)
}

/// The longest prefix of `full` that is a module of the crate.
fn deepest_known(full: &[String], known: &BTreeSet<Module>) -> Option<Module> {
    (1..=full.len())
        .rev()
        .map(|n| full[..n].to_vec())
        .find(|candidate| known.contains(candidate))
}

/// `path`, named in `module`, from the crate's root; `None` when it is not the crate's.
fn absolute(module: &Module, path: &[String]) -> Option<Module> {
    let (mut full, rest): (Module, &[String]) = match path.first()?.as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "super" | "self" => {
            let mut base = module.clone();
            let mut rest = path;
            while let Some(first) = rest.first() {
                match first.as_str() {
                    "super" => {
                        base.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
            (base, rest)
        }
        _ => return None,
    };
    full.extend(rest.iter().cloned());
    Some(full)
}

/// For each parent, the circles among its children, an edge between two children standing for
/// any import from one's subtree into the other's.
fn sibling_circles(
    known: &BTreeSet<Module>,
    edges: &BTreeMap<Module, BTreeSet<Module>>,
) -> Vec<String> {
    let mut parents: BTreeSet<Module> = known.iter().map(|m| m[..m.len() - 1].to_vec()).collect();
    parents.insert(Vec::new());
    let mut circles = Vec::new();
    for parent in parents {
        let depth = parent.len();
        let under = |m: &Module| m.len() > depth && m[..depth] == parent[..];
        let mut children: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for (from, targets) in edges.iter().filter(|(from, _)| under(from)) {
            for to in targets.iter().filter(|to| under(to)) {
                if from[depth] != to[depth] {
                    children
                        .entry(from[depth].as_str())
                        .or_default()
                        .insert(to[depth].as_str());
                }
            }
        }
        for component in strongly_connected(&children) {
            let name = if parent.is_empty() {
                "crate".to_string()
            } else {
                parent.join("::")
            };
            circles.push(format!("{name}: {}", component.join(" ↔ ")));
        }
    }
    circles
}

/// The strongly connected components with more than one node (Tarjan's algorithm).
fn strongly_connected<'a>(graph: &BTreeMap<&'a str, BTreeSet<&'a str>>) -> Vec<Vec<&'a str>> {
    struct Walk<'g, 'a> {
        graph: &'g BTreeMap<&'a str, BTreeSet<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<Vec<&'a str>>,
    }
    impl<'a> Walk<'_, 'a> {
        fn visit(&mut self, node: &'a str) {
            let at = self.index.len();
            self.index.insert(node, at);
            self.low.insert(node, at);
            self.stack.push(node);
            let graph = self.graph;
            for &next in graph.get(node).into_iter().flatten() {
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next]);
                    self.low.insert(node, low);
                } else if self.stack.contains(&next) {
                    let low = self.low[node].min(self.index[next]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut component = Vec::new();
                while let Some(top) = self.stack.pop() {
                    component.push(top);
                    if top == node {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for &node in graph.keys() {
        if !walk.index.contains_key(node) {
            walk.visit(node);
        }
    }
    walk.found
}
