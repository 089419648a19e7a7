//! The recipes as a forest: a root recipe runs on an uploaded object that
//! its `match` selects; a chained recipe runs on one output file of its
//! `input.recipe`, for every object its root runs on. Pure.

/// Where a chained recipe's input comes from: one output file of another
/// recipe's job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainedInput {
    /// The upstream recipe's name.
    pub recipe: String,
    /// The file in the upstream job's manifest (for example `poster.jpg`).
    pub file: String,
}

/// What the graph needs of one recipe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// The recipe's name: its `name`, or its step when it has none.
    pub name: String,
    /// Whether the name was given (a step's name may repeat among
    /// unnamed recipes, as long as no recipe takes its input from it).
    pub named: bool,
    pub input: Option<ChainedInput>,
    /// Whether the recipe has a `match` of its own.
    pub has_match: bool,
}

/// Why a graph is refused: the recipe and the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("recipe {index} ({name}): {problem}")]
pub struct GraphError {
    pub index: usize,
    pub name: String,
    pub problem: String,
}

/// The recipes by index: each one's upstream and downstream recipes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Graph {
    parent: Vec<Option<usize>>,
    children: Vec<Vec<usize>>,
}

impl Graph {
    /// Checks `nodes` and links them: given names are unique, every
    /// `input.recipe` names exactly one recipe, no recipe is its own
    /// ancestor, and a chained recipe has no `match` (it follows its
    /// root's: a chained job's input is an output, never an upload).
    pub fn new(nodes: &[Node]) -> Result<Graph, GraphError> {
        let refuse = |index: usize, problem: String| GraphError {
            index,
            name: nodes[index].name.clone(),
            problem,
        };
        for (index, node) in nodes.iter().enumerate() {
            if node.named {
                if let Some(first) = nodes[..index]
                    .iter()
                    .position(|other| other.named && other.name == node.name)
                {
                    return Err(refuse(
                        index,
                        format!("the name {:?} is taken by recipe {first}", node.name),
                    ));
                }
            }
        }
        let mut parent = vec![None; nodes.len()];
        let mut children = vec![Vec::new(); nodes.len()];
        for (index, node) in nodes.iter().enumerate() {
            let Some(input) = &node.input else { continue };
            if node.has_match {
                return Err(refuse(
                    index,
                    format!(
                        "a recipe with an input has no match of its own: it runs for every \
                         object that {:?} runs for",
                        input.recipe
                    ),
                ));
            }
            let named: Vec<usize> = (0..nodes.len())
                .filter(|&i| nodes[i].name == input.recipe)
                .collect();
            let upstream = match named.as_slice() {
                [] => {
                    return Err(refuse(
                        index,
                        format!("input.recipe {:?} names no recipe", input.recipe),
                    ))
                }
                [one] => *one,
                many => {
                    return Err(refuse(
                        index,
                        format!(
                            "input.recipe {:?} names recipes {many:?}: give them distinct names",
                            input.recipe
                        ),
                    ))
                }
            };
            parent[index] = Some(upstream);
            children[upstream].push(index);
        }
        for start in 0..nodes.len() {
            // Each recipe has at most one upstream: following them either
            // reaches a root or comes back round.
            let mut at = start;
            for _ in 0..nodes.len() {
                match parent[at] {
                    Some(up) if up == start => {
                        return Err(refuse(
                            start,
                            "its inputs lead back to itself (a cycle)".into(),
                        ))
                    }
                    Some(up) => at = up,
                    None => break,
                }
            }
        }
        Ok(Graph { parent, children })
    }

    /// The recipe `index` takes its input from, if it is chained.
    pub fn parent(&self, index: usize) -> Option<usize> {
        self.parent.get(index).copied().flatten()
    }

    /// The recipes that take their input from `index`, in configured order.
    pub fn children(&self, index: usize) -> &[usize] {
        self.children.get(index).map_or(&[], Vec::as_slice)
    }

    /// Whether `index` runs on uploads (it has no input of its own).
    pub fn is_root(&self, index: usize) -> bool {
        self.parent(index).is_none()
    }

    /// `roots` and every recipe downstream of them, each once, parents
    /// before children (breadth first).
    pub fn pipeline_of(&self, roots: &[usize]) -> Vec<usize> {
        let mut order: Vec<usize> = roots.to_vec();
        let mut next = 0;
        while next < order.len() {
            for &child in self.children(order[next]) {
                if !order.contains(&child) {
                    order.push(child);
                }
            }
            next += 1;
        }
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(name: &str) -> Node {
        Node {
            name: name.into(),
            named: true,
            input: None,
            has_match: true,
        }
    }

    fn chained(name: &str, from: &str) -> Node {
        Node {
            name: name.into(),
            named: true,
            input: Some(ChainedInput {
                recipe: from.into(),
                file: "poster.jpg".into(),
            }),
            has_match: false,
        }
    }

    #[test]
    fn a_poster_feeding_thumbnails_beside_a_package() {
        let graph = Graph::new(&[
            root("poster"),
            chained("poster-thumbs", "poster"),
            root("hls"),
            chained("poster-small", "poster-thumbs"),
        ])
        .unwrap();
        assert_eq!(graph.children(0), [1]);
        assert_eq!(graph.parent(3), Some(1));
        assert!(graph.is_root(2) && !graph.is_root(1));
        assert_eq!(graph.pipeline_of(&[0, 2]), [0, 2, 1, 3]);
        assert_eq!(graph.pipeline_of(&[2]), [2]);
    }

    #[test]
    fn unnamed_recipes_may_share_a_step_unless_something_reads_from_it() {
        let unnamed = |step: &str| Node {
            named: false,
            ..root(step)
        };
        assert!(Graph::new(&[unnamed("thumbnail"), unnamed("thumbnail")]).is_ok());
        let err = Graph::new(&[
            unnamed("thumbnail"),
            unnamed("thumbnail"),
            chained("small", "thumbnail"),
        ])
        .unwrap_err();
        assert_eq!(err.index, 2);
        assert!(err.problem.contains("distinct names"), "{err}");
    }

    #[test]
    fn bad_graphs_name_the_recipe() {
        let cases: Vec<(Vec<Node>, usize, &str)> = vec![
            (vec![root("a"), root("a")], 1, "taken by recipe 0"),
            (vec![chained("b", "nowhere")], 0, "names no recipe"),
            (vec![chained("a", "b"), chained("b", "a")], 0, "a cycle"),
            (vec![chained("self", "self")], 0, "a cycle"),
            (
                vec![
                    root("poster"),
                    Node {
                        has_match: true,
                        ..chained("t", "poster")
                    },
                ],
                1,
                "no match of its own",
            ),
        ];
        for (nodes, index, problem) in cases {
            let err = Graph::new(&nodes).unwrap_err();
            assert_eq!(err.index, index, "{err}");
            assert!(err.to_string().contains(problem), "{err}");
            assert!(
                err.to_string().starts_with(&format!("recipe {index} (")),
                "{err}"
            );
        }
    }
}
