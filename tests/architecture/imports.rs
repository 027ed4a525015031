//! The import graph between a crate's source files, read from the code itself: every
//! `use` and every path that starts with `crate`, `super` or `self`, resolved through
//! the modules' imports and re-exports to the file that defines the item.
//!
//! It is a reader of the code's text, not a compiler: comments, strings and
//! `#[cfg(test)]` modules are skipped; macros' insides are read as paths like any other;
//! a glob import is followed only where the name is not bound otherwise.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One source file of a crate and its module path (`a::b` for `src/a/b.rs` or
/// `src/a/b/mod.rs`; empty for the crate root).
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// The module path, segments.
    pub module: Vec<String>,
    /// The file.
    pub path: PathBuf,
}

/// Every `.rs` file under `src` (the crate root `lib.rs` or `main.rs`), with its module.
pub fn source_files(src: &Path) -> Vec<SourceFile> {
    let mut files = Vec::new();
    collect(src, src, &mut files);
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files
}

fn collect(src: &Path, dir: &Path, files: &mut Vec<SourceFile>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(src, &path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path.strip_prefix(src).expect("under src");
            let mut module: Vec<String> = relative
                .with_extension("")
                .iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect();
            if matches!(
                module.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                module.pop();
            }
            files.push(SourceFile { module, path });
        }
    }
}

/// The source with comments, string and character literals blanked out (lifetimes
/// kept), so that only code remains.
fn code_only(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r'
            && (next == Some('#') || next == Some('"'))
            && !ident_char_before(&chars, i)
        {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            'raw: while j < chars.len() {
                if chars[j] == '"' && (0..hashes).all(|h| chars.get(j + 1 + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break 'raw;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            // A character literal ('a', '\n', '\u{..}') or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push_str("' '");
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_char_before(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// Tokens: identifiers, `::`, and single punctuation characters.
fn tokens(code: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push("::".into());
            i += 2;
        } else if c.is_whitespace() {
            i += 1;
        } else {
            out.push(c.to_string());
            i += 1;
        }
    }
    out
}

/// Drops every `#[cfg(test)]` item that is a module with a body (`mod tests { .. }`).
fn without_test_modules(tokens: Vec<String>) -> Vec<String> {
    let is = |t: &[String], i: usize, s: &str| t.get(i).is_some_and(|x| x == s);
    let mut out = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        let cfg_test = is(&tokens, i, "#")
            && is(&tokens, i + 1, "[")
            && is(&tokens, i + 2, "cfg")
            && is(&tokens, i + 3, "(")
            && is(&tokens, i + 4, "test")
            && is(&tokens, i + 5, ")")
            && is(&tokens, i + 6, "]");
        if cfg_test {
            // Skip to the end of the item: a `;` before any `{`, or the matching `}`.
            let mut j = i + 7;
            while j < tokens.len() && tokens[j] != "{" && tokens[j] != ";" {
                j += 1;
            }
            if j < tokens.len() && tokens[j] == "{" {
                let mut depth = 0;
                while j < tokens.len() {
                    match tokens[j].as_str() {
                        "{" => depth += 1,
                        "}" => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    j += 1;
                }
            }
            i = j + 1;
            continue;
        }
        out.push(tokens[i].clone());
        i += 1;
    }
    out
}

/// A path as written, and the module it is written in.
type Written = (Vec<String>, Vec<String>);

/// What one file says: the names its modules bind with `use`, their glob imports, and
/// every path it names, each as written (resolved once every module is known).
#[derive(Debug, Default)]
struct FileFacts {
    /// Module (file module plus inline modules) → name → the path it binds.
    bindings: BTreeMap<Vec<String>, BTreeMap<String, Written>>,
    /// Module → glob-imported module paths.
    globs: BTreeMap<Vec<String>, Vec<Written>>,
    /// Inline modules declared in the file (absolute paths).
    inline_modules: BTreeSet<Vec<String>>,
    /// Paths the file names.
    references: Vec<Written>,
    /// Whether the file is test-only (`#[cfg(test)] mod x;` in its parent).
    test_children: BTreeSet<String>,
}

/// `segments` made absolute from module `current`: `crate::a` → `[a]`, `super::b` →
/// the parent's `b`, `self::c` and a child module's `c::d` → inside `current`; `None` for
/// another crate's path.
fn absolute(
    current: &[String],
    segments: &[String],
    is_module: &dyn Fn(&[String]) -> bool,
) -> Option<Vec<String>> {
    let mut base: Vec<String> = match segments.first().map(String::as_str) {
        Some("crate") => Vec::new(),
        Some("self") | Some("super") => current.to_vec(),
        Some(first) => {
            let mut child = current.to_vec();
            child.push(first.to_string());
            if !is_module(&child) {
                return None;
            }
            current.to_vec()
        }
        None => return None,
    };
    let mut rest = segments;
    if rest[0] == "crate" {
        rest = &rest[1..];
    } else if rest[0] == "self" || rest[0] == "super" {
        while let Some(first) = rest.first() {
            match first.as_str() {
                "self" => rest = &rest[1..],
                "super" => {
                    base.pop()?;
                    rest = &rest[1..];
                }
                _ => break,
            }
        }
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// Expands the use tree at `tokens[i..]` (after `use`), calling `bind` with each leaf's
/// path and the name it binds; returns the index after the tree.
fn use_tree(
    tokens: &[String],
    mut i: usize,
    prefix: &mut Vec<String>,
    bind: &mut dyn FnMut(Vec<String>, Option<String>),
) -> usize {
    let depth = prefix.len();
    loop {
        match tokens.get(i).map(String::as_str) {
            Some("::") => i += 1,
            Some("{") => {
                i += 1;
                loop {
                    i = use_tree(tokens, i, prefix, bind);
                    match tokens.get(i).map(String::as_str) {
                        Some(",") => i += 1,
                        Some("}") => {
                            i += 1;
                            break;
                        }
                        _ => break,
                    }
                    if tokens.get(i).is_some_and(|t| t == "}") {
                        i += 1;
                        break;
                    }
                }
                prefix.truncate(depth);
                return i;
            }
            Some("*") => {
                bind(prefix.clone(), None);
                prefix.truncate(depth);
                return i + 1;
            }
            Some("as") => {
                let alias = tokens.get(i + 1).cloned();
                bind(prefix.clone(), alias);
                prefix.truncate(depth);
                return i + 2;
            }
            Some(t) if t.chars().all(|c| c.is_alphanumeric() || c == '_') => {
                prefix.push(t.to_string());
                i += 1;
            }
            _ => {
                if prefix.len() > depth {
                    let name = prefix.last().cloned();
                    bind(prefix.clone(), name);
                }
                prefix.truncate(depth);
                return i;
            }
        }
    }
}

fn facts(file: &SourceFile, source: &str) -> FileFacts {
    let tokens = tokens(&code_only(source));
    let mut facts = FileFacts::default();
    // Children declared `#[cfg(test)] mod name;` are test files.
    for w in tokens.windows(10) {
        if w[0] == "#" && w[2] == "cfg" && w[4] == "test" && w[7] == "mod" && w[9] == ";" {
            facts.test_children.insert(w[8].clone());
        }
    }
    let tokens = without_test_modules(tokens);
    // The module at each brace depth: inline `mod name {` opens one.
    let mut stack: Vec<(usize, Vec<String>)> = vec![(0, file.module.clone())];
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        let current = stack.last().expect("the file's module").1.clone();
        match tokens[i].as_str() {
            "{" => depth += 1,
            "}" => {
                if stack.len() > 1 && stack.last().is_some_and(|(d, _)| *d == depth) {
                    stack.pop();
                }
                depth = depth.saturating_sub(1);
            }
            "mod" if tokens.get(i + 2).is_some_and(|t| t == "{") => {
                let mut inner = current.clone();
                inner.push(tokens[i + 1].clone());
                facts.inline_modules.insert(inner.clone());
                stack.push((depth + 1, inner));
            }
            "use" => {
                let mut leaves = Vec::new();
                let end = use_tree(&tokens, i + 1, &mut Vec::new(), &mut |path, name| {
                    leaves.push((path, name))
                });
                for (path, name) in leaves {
                    facts.references.push((current.clone(), path.clone()));
                    match name {
                        None => {
                            let globs = facts.globs.entry(current.clone()).or_default();
                            globs.push((current.clone(), path));
                        }
                        Some(name) if name == "self" => {
                            let binds = path[path.len() - 2].clone();
                            let module = path[..path.len() - 1].to_vec();
                            let module_bindings = facts.bindings.entry(current.clone());
                            module_bindings
                                .or_default()
                                .insert(binds, (current.clone(), module));
                        }
                        Some(name) => {
                            let module_bindings = facts.bindings.entry(current.clone());
                            module_bindings
                                .or_default()
                                .insert(name, (current.clone(), path));
                        }
                    }
                }
                i = end.max(i + 1);
                continue;
            }
            "crate" | "super" | "self" if i == 0 || tokens[i - 1] != "::" => {
                let mut path = vec![tokens[i].clone()];
                let mut j = i + 1;
                while tokens.get(j).is_some_and(|t| t == "::")
                    && tokens
                        .get(j + 1)
                        .is_some_and(|t| t.chars().all(|c| c.is_alphanumeric() || c == '_'))
                {
                    path.push(tokens[j + 1].clone());
                    j += 2;
                }
                if path.len() > 1 {
                    facts.references.push((current.clone(), path));
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    facts
}

/// A crate's files and what each imports from which other file.
pub struct ImportGraph {
    /// The files (test-only files left out).
    pub files: Vec<SourceFile>,
    /// `(from, to)` indices into `files`, without self-loops.
    pub edges: BTreeSet<(usize, usize)>,
}

impl ImportGraph {
    /// Reads every file of the crate whose sources are under `src`.
    pub fn read(src: &Path) -> Self {
        let all = source_files(src);
        let sources: Vec<String> = all
            .iter()
            .map(|f| std::fs::read_to_string(&f.path).expect("a readable source file"))
            .collect();
        let all_facts: Vec<FileFacts> =
            all.iter().zip(&sources).map(|(f, s)| facts(f, s)).collect();
        // Test-only files: declared `#[cfg(test)] mod name;`, or under such a module.
        let test_modules: Vec<Vec<String>> = all
            .iter()
            .zip(&all_facts)
            .flat_map(|(f, facts)| {
                facts.test_children.iter().map(|child| {
                    let mut m = f.module.clone();
                    m.push(child.clone());
                    m
                })
            })
            .collect();
        let keep: Vec<bool> = all
            .iter()
            .map(|f| !test_modules.iter().any(|t| f.module.starts_with(t)))
            .collect();
        let mut module_file: BTreeMap<Vec<String>, usize> = BTreeMap::new();
        for (index, (file, facts)) in all.iter().zip(&all_facts).enumerate() {
            module_file.insert(file.module.clone(), index);
            for inline in &facts.inline_modules {
                module_file.insert(inline.clone(), index);
            }
        }
        let is_module = |m: &[String]| module_file.contains_key(m);
        let resolve = |(current, path): &Written| absolute(current, path, &is_module);
        let mut bindings: BTreeMap<Vec<String>, BTreeMap<String, Option<Vec<String>>>> =
            BTreeMap::new();
        let mut globs: BTreeMap<Vec<String>, Vec<Vec<String>>> = BTreeMap::new();
        for facts in &all_facts {
            for (module, names) in &facts.bindings {
                let resolved = names.iter().map(|(n, w)| (n.clone(), resolve(w)));
                bindings.entry(module.clone()).or_default().extend(resolved);
            }
            for (module, list) in &facts.globs {
                let resolved = list.iter().filter_map(resolve);
                globs.entry(module.clone()).or_default().extend(resolved);
            }
        }
        let references: Vec<Vec<Vec<String>>> = all_facts
            .iter()
            .map(|f| f.references.iter().filter_map(resolve).collect())
            .collect();
        let resolver = Resolver {
            bindings,
            globs,
            module_file,
        };
        let mut edges = BTreeSet::new();
        for (from, references) in references.iter().enumerate() {
            if !keep[from] {
                continue;
            }
            for reference in references {
                if let Some(to) = resolver.file_of(reference, 0)
                    && to != from
                    && keep[to]
                {
                    edges.insert((from, to));
                }
            }
        }
        // Renumber without the test files.
        let new_index: Vec<Option<usize>> = keep
            .iter()
            .scan(0, |next, &k| {
                Some(k.then(|| {
                    *next += 1;
                    *next - 1
                }))
            })
            .collect();
        let files = all
            .into_iter()
            .zip(&keep)
            .filter(|(_, k)| **k)
            .map(|(f, _)| f)
            .collect();
        let edges = edges
            .into_iter()
            .filter_map(|(a, b)| Some((new_index[a]?, new_index[b]?)))
            .collect();
        ImportGraph { files, edges }
    }

    /// Groups of two or more files that import each other, directly or around a circle,
    /// leaving out every import between a module and its ancestor (a parent module and its
    /// child may name each other's items). Each group is listed by file, sorted.
    pub fn circles(&self) -> Vec<Vec<PathBuf>> {
        let n = self.files.len();
        let related = |a: usize, b: usize| {
            let (ma, mb) = (&self.files[a].module, &self.files[b].module);
            ma.starts_with(mb) || mb.starts_with(ma)
        };
        let mut next: Vec<Vec<usize>> = vec![Vec::new(); n];
        for &(a, b) in &self.edges {
            if !related(a, b) {
                next[a].push(b);
            }
        }
        let mut circles: Vec<Vec<PathBuf>> = strongly_connected(&next)
            .into_iter()
            .filter(|c| c.len() > 1)
            .map(|c| {
                let mut files: Vec<PathBuf> =
                    c.iter().map(|&i| self.files[i].path.clone()).collect();
                files.sort();
                files
            })
            .collect();
        circles.sort();
        circles
    }
}

struct Resolver {
    bindings: BTreeMap<Vec<String>, BTreeMap<String, Option<Vec<String>>>>,
    globs: BTreeMap<Vec<String>, Vec<Vec<String>>>,
    module_file: BTreeMap<Vec<String>, usize>,
}

impl Resolver {
    /// The file that defines what `path` names (following `use` bindings and re-exports);
    /// `None` for what lies outside the crate.
    fn file_of(&self, path: &[String], hops: usize) -> Option<usize> {
        if hops > 16 {
            return None;
        }
        // The longest prefix that is a module.
        let mut split = path.len();
        while split > 0 && !self.module_file.contains_key(&path[..split]) {
            split -= 1;
        }
        let module = &path[..split];
        let Some(name) = path.get(split) else {
            return self.module_file.get(module).copied();
        };
        if let Some(bound) = self.bindings.get(module).and_then(|b| b.get(name)) {
            let mut target = bound.clone()?;
            target.extend(path[split + 1..].iter().cloned());
            return self.file_of(&target, hops + 1);
        }
        for glob in self.globs.get(module).into_iter().flatten() {
            let mut target = glob.clone();
            target.extend(path[split..].iter().cloned());
            if let Some(found) = self.defined_or_bound(&target, hops) {
                return Some(found);
            }
        }
        // Defined in the module itself.
        self.module_file.get(module).copied()
    }

    /// `file_of` for a glob's candidate: only where the glob's module binds or holds the
    /// name as a module (its own items cannot be told apart from a miss).
    fn defined_or_bound(&self, path: &[String], hops: usize) -> Option<usize> {
        let (module, name) = path.split_at(path.len() - 1);
        let bound = self
            .bindings
            .get(module)
            .is_some_and(|b| b.contains_key(&name[0]));
        let is_module = self.module_file.contains_key(path);
        (bound || is_module)
            .then(|| self.file_of(path, hops + 1))
            .flatten()
    }
}

/// Tarjan's strongly connected components of the graph `next` (adjacency lists).
fn strongly_connected(next: &[Vec<usize>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        next: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        counter: usize,
        components: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State, v: usize) {
        s.index[v] = Some(s.counter);
        s.low[v] = s.counter;
        s.counter += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for &w in &s.next[v] {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                component.push(w);
                if w == v {
                    break;
                }
            }
            s.components.push(component);
        }
    }
    let n = next.len();
    let mut s = State {
        next,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        counter: 0,
        components: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.components
}
