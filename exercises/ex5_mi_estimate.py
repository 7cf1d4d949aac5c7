"""Exercise 5 (paper §2.3, App. F): the in-batch MI proxy from a cross-scoring matrix.

Row i is a reasoning z_i; column j is a prompt x_j; L[i][j] = log q(z_i | x_j) (teacher-forced score of the
reasoning under every prompt of the batch); true_col[i] is the column of z_i's own prompt.

  * MI-Est (per sequence): mean over rows of  L[i][true_col[i]] - log( (1/N) sum_j exp L[i][j] ),
    the log-likelihood of the own prompt against the uniform mixture over all N prompts (<= log N).
    Use a numerically stable log-sum-exp.
  * retrieval accuracy: the fraction of rows whose best-scoring column (ties: the lowest index) is "correct",
    where a column counts as correct when its prompt is identical to the true one: signatures[j] names the
    prompt of column j, and equal signatures are the same prompt (duplicate prompts in a batch).

Grade: python exercises/check.py 5
"""


def mi_estimate(L, true_col):
    """L: M x N nested list of log-scores; true_col: M ints. Return MI-Est as a float."""
    raise NotImplementedError("exercise 5a: matched score minus the log-mean-exp over columns, averaged")


def retrieval_accuracy(L, true_col, signatures):
    """signatures: N hashables (equal = same prompt). Return the retrieval accuracy as a float."""
    raise NotImplementedError("exercise 5b: argmax column per row, compared by signature")
