"""The bundled problem set of DeepCoder-mini: 70 short Python problems written for nanoRAGEN (deepcoder.py).

What it holds: `PROBLEMS`, a list of dicts, 50 function-style problems (call `func_name(*args)`, compare
`str(result)` with `str(expected)`, as the official harness's "functional" tests) and 20 stdin-style problems (the
program reads standard input; its stripped output must equal the stripped expected text, the official
"stdin_stdout" tests). Every problem has public tests (shown to the model as examples) and hidden tests (only
graded); the reward counts both, as the official ground truth does. Easy-to-medium string / list / arithmetic tasks
a 135M model can sometimes solve, in the spirit of the official PrimeIntellect / TACO / LiveCodeBench mix (which is
multi-GB and needs a download; this set needs nothing).

Fields: name, kind ("function" | "stdin"), statement, signature and func_name (function problems),
public / hidden: [(args list, expected value)] for function problems, [(stdin text, expected stdout)] for stdin
problems, reference: a solution. The expected values were written by hand; the references are used only by the tests
(tests/test_deepcoder.py runs every reference on every test in the sandbox, so each problem is solvable and each
expected value is checked by an independent computation) and as the scripted `--show` solution.

Left out: problems that need third-party packages, floating-point tolerance, or special judges.
Run: `python envs.py deepcoder --seed 10000 --show` shows one problem.
"""
import re


def func(name, signature, statement, public, hidden, reference):
    """A function-style problem; func_name is read from the signature ("def name(...):")."""
    return dict(name=name, kind="function", func_name=re.match(r"def (\w+)\(", signature).group(1),
                signature=signature, statement=statement, public=public, hidden=hidden, reference=reference.strip())


def stdio(name, statement, public, hidden, reference):
    """A stdin-style problem: the program reads the input text and prints the answer."""
    return dict(name=name, kind="stdin", statement=statement, public=public, hidden=hidden,
                reference=reference.strip())


PROBLEMS = [
    # ------------------------------------------------------------------------------------- function problems
    func("add_numbers", "def add_numbers(a, b):", "Return the sum of the integers a and b.",
       [([2, 3], 5), ([-4, 10], 6)],
       [([0, 0], 0), ([100, 250], 350), ([-7, -8], -15), ([123456, 654321], 777777)], """
def add_numbers(a, b):
    return a + b
"""),
    func("is_even", "def is_even(n):", "Return True if the integer n is even, otherwise False.",
       [([4], True), ([7], False)],
       [([0], True), ([-3], False), ([1000], True), ([999999], False)], """
def is_even(n):
    return n % 2 == 0
"""),
    func("max_in_list", "def max_in_list(nums):", "Return the largest number in the non-empty list nums.",
       [([[3, 9, 2]], 9), ([[-5, -1, -7]], -1)],
       [([[42]], 42), ([[1, 2, 3, 4, 5]], 5), ([[10, 10, 3]], 10), ([[0, -1, 8, 8, 7]], 8)], """
def max_in_list(nums):
    best = nums[0]
    for x in nums:
        if x > best:
            best = x
    return best
"""),
    func("reverse_string", "def reverse_string(s):", "Return the string s reversed.",
       [(["hello"], "olleh"), (["ab c"], "c ba")],
       [([""], ""), (["a"], "a"), (["racecar"], "racecar"), (["Python3"], "3nohtyP")], """
def reverse_string(s):
    return s[::-1]
"""),
    func("count_vowels", "def count_vowels(s):",
       "Return how many characters of s are vowels (a, e, i, o, u, in upper or lower case).",
       [(["hello"], 2), (["AEIOU xyz"], 5)],
       [([""], 0), (["rhythm"], 0), (["Programming Is Fun"], 5), (["aaaa"], 4)], """
def count_vowels(s):
    return sum(1 for ch in s.lower() if ch in "aeiou")
"""),
    func("is_palindrome", "def is_palindrome(s):",
       "Return True if the string s reads the same forwards and backwards (compare characters exactly), "
       "otherwise False.",
       [(["level"], True), (["hello"], False)],
       [([""], True), (["a"], True), (["abba"], True), (["Abba"], False), (["abca"], False)], """
def is_palindrome(s):
    return s == s[::-1]
"""),
    func("factorial", "def factorial(n):", "Return n! = 1 * 2 * ... * n for an integer n >= 0 (0! is 1).",
       [([5], 120), ([0], 1)],
       [([1], 1), ([3], 6), ([10], 3628800), ([12], 479001600)], """
def factorial(n):
    result = 1
    for i in range(2, n + 1):
        result *= i
    return result
"""),
    func("fibonacci", "def fibonacci(n):",
       "Return the n-th Fibonacci number: fibonacci(0) = 0, fibonacci(1) = 1, and every later number is the sum "
       "of the two before it.",
       [([6], 8), ([1], 1)],
       [([0], 0), ([2], 1), ([10], 55), ([20], 6765), ([30], 832040)], """
def fibonacci(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a
"""),
    func("digit_sum", "def digit_sum(n):", "Return the sum of the decimal digits of the integer n >= 0.",
       [([123], 6), ([9005], 14)],
       [([0], 0), ([7], 7), ([99999], 45), ([1010101], 4)], """
def digit_sum(n):
    return sum(int(d) for d in str(n))
"""),
    func("count_words", "def count_words(s):",
       "Return the number of words in the string s; words are separated by one or more spaces.",
       [(["the quick brown fox"], 4), (["  hello   world "], 2)],
       [([""], 0), (["one"], 1), (["a b c d e f"], 6), (["   "], 0)], """
def count_words(s):
    return len(s.split())
"""),
    func("reverse_words", "def reverse_words(s):",
       "Return the words of s (separated by one or more spaces) in reverse order, joined by single spaces.",
       [(["hello world"], "world hello"), (["a b c"], "c b a")],
       [(["one"], "one"), (["  fly   me  to "], "to me fly"), (["Python is fun"], "fun is Python"),
        (["x y"], "y x")], """
def reverse_words(s):
    return " ".join(reversed(s.split()))
"""),
    func("capitalize_words", "def capitalize_words(s):",
       "The words of s are separated by single spaces. Return s with the first letter of every word in upper "
       "case and all other letters in lower case.",
       [(["hello world"], "Hello World"), (["pYTHON rocks"], "Python Rocks")],
       [(["a"], "A"), ([""], ""), (["one two three"], "One Two Three"), (["mIxEd CaSe"], "Mixed Case")], """
def capitalize_words(s):
    return " ".join(w[:1].upper() + w[1:].lower() for w in s.split(" "))
"""),
    func("remove_duplicates", "def remove_duplicates(nums):",
       "Return a new list with the repeated values of nums removed, keeping the first occurrence of every value "
       "in its original order.",
       [([[1, 2, 1, 3, 2]], [1, 2, 3]), ([[5, 5, 5]], [5])],
       [([[]], []), ([[3, 1, 2]], [3, 1, 2]), ([[4, 3, 4, 3, 9, 4]], [4, 3, 9]), ([[0, -1, 0, -1, 2]], [0, -1, 2])],
       """
def remove_duplicates(nums):
    seen, result = set(), []
    for x in nums:
        if x not in seen:
            seen.add(x)
            result.append(x)
    return result
"""),
    func("second_largest", "def second_largest(nums):",
       "Return the second largest distinct value in nums (nums holds at least two distinct values).",
       [([[3, 1, 4, 1, 5]], 4), ([[10, 10, 9]], 9)],
       [([[1, 2]], 1), ([[-1, -2, -3]], -2), ([[7, 7, 7, 3, 3]], 3), ([[5, 1, 5, 4, 5]], 4)], """
def second_largest(nums):
    return sorted(set(nums))[-2]
"""),
    func("gcd", "def gcd(a, b):", "Return the greatest common divisor of the positive integers a and b.",
       [([12, 18], 6), ([7, 5], 1)],
       [([100, 75], 25), ([9, 9], 9), ([1, 50], 1), ([270, 192], 6)], """
def gcd(a, b):
    while b:
        a, b = b, a % b
    return a
"""),
    func("lcm", "def lcm(a, b):", "Return the least common multiple of the positive integers a and b.",
       [([4, 6], 12), ([3, 5], 15)],
       [([7, 7], 7), ([1, 9], 9), ([12, 18], 36), ([21, 6], 42)], """
def lcm(a, b):
    m = max(a, b)
    while m % a or m % b:
        m += max(a, b)
    return m
"""),
    func("is_prime", "def is_prime(n):",
       "Return True if the integer n is a prime number, otherwise False (numbers below 2 are not prime).",
       [([7], True), ([10], False)],
       [([1], False), ([2], True), ([0], False), ([97], True), ([91], False), ([7919], True)], """
def is_prime(n):
    if n < 2:
        return False
    d = 2
    while d * d <= n:
        if n % d == 0:
            return False
        d += 1
    return True
"""),
    func("primes_up_to", "def primes_up_to(n):", "Return the list of all prime numbers <= n, in increasing order.",
       [([10], [2, 3, 5, 7]), ([2], [2])],
       [([1], []), ([20], [2, 3, 5, 7, 11, 13, 17, 19]), ([30], [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]),
        ([3], [2, 3])], """
def primes_up_to(n):
    return [p for p in range(2, n + 1) if all(p % d for d in range(2, int(p ** 0.5) + 1))]
"""),
    func("count_char", "def count_char(s, c):", "Return how many times the single character c occurs in the string s.",
       [(["banana", "a"], 3), (["hello", "z"], 0)],
       [(["", "x"], 0), (["aaaa", "a"], 4), (["Mississippi", "s"], 4), (["AaAa", "a"], 2)], """
def count_char(s, c):
    return s.count(c)
"""),
    func("running_sum", "def running_sum(nums):",
       "Return the list of running sums of nums: element i is nums[0] + nums[1] + ... + nums[i].",
       [([[1, 2, 3, 4]], [1, 3, 6, 10]), ([[5]], [5])],
       [([[]], []), ([[1, -1, 1, -1]], [1, 0, 1, 0]), ([[0, 0, 7]], [0, 0, 7]), ([[10, 20, 30]], [10, 30, 60])], """
def running_sum(nums):
    total, result = 0, []
    for x in nums:
        total += x
        result.append(total)
    return result
"""),
    func("flatten", "def flatten(lists):",
         "Return one list holding the elements of the inner lists of lists, in order.",
       [([[[1, 2], [3], [4, 5]]], [1, 2, 3, 4, 5]), ([[[], [1]]], [1])],
       [([[]], []), ([[[7]]], [7]), ([[[1], [], [2, 3], []]], [1, 2, 3]), ([[["a", "b"], ["c"]]], ["a", "b", "c"])],
       """
def flatten(lists):
    return [x for inner in lists for x in inner]
"""),
    func("chunk_list", "def chunk_list(nums, k):",
       "Split nums into consecutive pieces of length k (the last piece may be shorter) and return the list of "
       "pieces.",
       [([[1, 2, 3, 4, 5], 2], [[1, 2], [3, 4], [5]]), ([[1, 2, 3], 3], [[1, 2, 3]])],
       [([[], 4], []), ([[1, 2, 3], 1], [[1], [2], [3]]), ([[1, 2], 5], [[1, 2]]),
        ([[9, 8, 7, 6], 2], [[9, 8], [7, 6]])],
       """
def chunk_list(nums, k):
    return [nums[i:i + k] for i in range(0, len(nums), k)]
"""),
    func("rotate_left", "def rotate_left(nums, k):",
       "Return nums rotated left by k positions; k >= 0 may be larger than the length, and an empty list stays "
       "empty.",
       [([[1, 2, 3, 4, 5], 2], [3, 4, 5, 1, 2]), ([[1, 2, 3], 0], [1, 2, 3])],
       [([[], 3], []), ([[1, 2, 3], 3], [1, 2, 3]), ([[1, 2, 3], 4], [2, 3, 1]), ([[7, 8], 1], [8, 7])], """
def rotate_left(nums, k):
    if not nums:
        return []
    k %= len(nums)
    return nums[k:] + nums[:k]
"""),
    func("merge_sorted", "def merge_sorted(a, b):",
         "Merge the sorted lists a and b into one sorted list and return it.",
       [([[1, 3, 5], [2, 4, 6]], [1, 2, 3, 4, 5, 6]), ([[], [1, 2]], [1, 2])],
       [([[], []], []), ([[1, 1], [1]], [1, 1, 1]), ([[5, 10], [1, 2, 3]], [1, 2, 3, 5, 10]),
        ([[-3, 0], [-5, 7]], [-5, -3, 0, 7])], """
def merge_sorted(a, b):
    i, j, out = 0, 0, []
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    return out + a[i:] + b[j:]
"""),
    func("to_binary", "def to_binary(n):",
       "Return the binary representation of the integer n >= 0 as a string of 0s and 1s without a prefix "
       "(\"0\" for 0).",
       [([5], "101"), ([0], "0")],
       [([1], "1"), ([8], "1000"), ([255], "11111111"), ([10], "1010")], """
def to_binary(n):
    return bin(n)[2:]
"""),
    func("from_binary", "def from_binary(s):", "Return the integer whose binary representation is the string s.",
       [(["101"], 5), (["0"], 0)],
       [(["1"], 1), (["1111"], 15), (["100000"], 32), (["0011"], 3)], """
def from_binary(s):
    value = 0
    for bit in s:
        value = 2 * value + int(bit)
    return value
"""),
    func("is_anagram", "def is_anagram(a, b):",
       "Return True if the strings a and b hold exactly the same characters with the same counts, else False.",
       [(["listen", "silent"], True), (["abc", "abd"], False)],
       [(["", ""], True), (["aab", "abb"], False), (["evil", "vile"], True), (["ab", "abc"], False)], """
def is_anagram(a, b):
    return sorted(a) == sorted(b)
"""),
    func("most_common_char", "def most_common_char(s):",
       "Return the character that occurs most often in the non-empty string s; on a tie, the one that occurs "
       "first in s.",
       [(["banana"], "a"), (["abc"], "a")],
       [(["zzzaa"], "z"), (["abbcc"], "b"), (["x"], "x"), (["aabbbcc"], "b"), (["mississippi"], "i")], """
def most_common_char(s):
    best = s[0]
    for ch in s:
        if s.count(ch) > s.count(best):
            best = ch
    return best
"""),
    func("longest_word", "def longest_word(s):",
       "Return the longest word of s (words are separated by spaces); on a tie, the first one.",
       [(["the quick brown fox"], "quick"), (["a bb cc"], "bb")],
       [(["hello"], "hello"), (["one three five"], "three"), (["ab cd ef"], "ab"),
        (["I love programming"], "programming")], """
def longest_word(s):
    best = ""
    for w in s.split():
        if len(w) > len(best):
            best = w
    return best
"""),
    func("count_positive", "def count_positive(nums):", "Return how many numbers in nums are greater than zero.",
       [([[1, -2, 3, 0]], 2), ([[]], 0)],
       [([[-1, -2]], 0), ([[5, 5, 5]], 3), ([[0, 0, 1]], 1), ([[-10, 10, -20, 20, 30]], 3)], """
def count_positive(nums):
    return len([x for x in nums if x > 0])
"""),
    func("product_of_list", "def product_of_list(nums):",
         "Return the product of the numbers in nums (1 for an empty list).",
       [([[2, 3, 4]], 24), ([[]], 1)],
       [([[5]], 5), ([[1, 0, 9]], 0), ([[-2, 3]], -6), ([[-1, -1, -1, -1]], 1)], """
def product_of_list(nums):
    p = 1
    for x in nums:
        p *= x
    return p
"""),
    func("reverse_number", "def reverse_number(n):",
       "Return the integer whose decimal digits are those of n >= 0 in reverse order (leading zeros disappear).",
       [([123], 321), ([1200], 21)],
       [([0], 0), ([7], 7), ([1001], 1001), ([908070], 70809)], """
def reverse_number(n):
    return int(str(n)[::-1])
"""),
    func("caesar_shift", "def caesar_shift(s, k):",
       "Shift every lowercase letter of s by k places forward in the alphabet, wrapping around from z to a, and "
       "return the result; all other characters stay the same.",
       [(["abc", 1], "bcd"), (["xyz", 3], "abc")],
       [(["hello world", 13], "uryyb jbeyq"), (["a-b", 25], "z-a"), (["", 5], ""), (["Zoo", 1], "Zpp")], """
def caesar_shift(s, k):
    out = []
    for ch in s:
        if "a" <= ch <= "z":
            ch = chr((ord(ch) - ord("a") + k) % 26 + ord("a"))
        out.append(ch)
    return "".join(out)
"""),
    func("run_length", "def run_length(s):",
       "Run-length encode s: every maximal run of one repeated character becomes that character followed by the "
       "length of the run, for example \"aaab\" becomes \"a3b1\".",
       [(["aaabcc"], "a3b1c2"), (["x"], "x1")],
       [([""], ""), (["abc"], "a1b1c1"), (["zzzzzzzzzz"], "z10"), (["aabaa"], "a2b1a2")], """
def run_length(s):
    out, i = "", 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        out += s[i] + str(j - i)
        i = j
    return out
"""),
    func("is_sorted", "def is_sorted(nums):", "Return True if nums is sorted in non-decreasing order, else False.",
       [([[1, 2, 2, 5]], True), ([[3, 1]], False)],
       [([[]], True), ([[4]], True), ([[1, 3, 2, 4]], False), ([[-5, -5, 0]], True)], """
def is_sorted(nums):
    return all(nums[i] <= nums[i + 1] for i in range(len(nums) - 1))
"""),
    func("find_index", "def find_index(nums, x):",
       "Return the index of the first occurrence of x in nums, or -1 if x is not in nums.",
       [([[4, 5, 6], 5], 1), ([[1, 2], 9], -1)],
       [([[], 1], -1), ([[7, 7, 7], 7], 0), ([[1, 2, 3, 2], 2], 1), ([[0, 1, 2, 3, 4], 4], 4)], """
def find_index(nums, x):
    for i, v in enumerate(nums):
        if v == x:
            return i
    return -1
"""),
    func("two_sum", "def two_sum(nums, target):",
       "Return [i, j] with i < j and nums[i] + nums[j] == target, choosing the smallest such i and then the "
       "smallest j. Such a pair always exists.",
       [([[2, 7, 11, 15], 9], [0, 1]), ([[3, 2, 4], 6], [1, 2])],
       [([[1, 1], 2], [0, 1]), ([[5, 0, 5, 0], 5], [0, 1]), ([[1, 2, 3, 4], 7], [2, 3]),
        ([[-1, 8, 3, 10], 2], [0, 2])], """
def two_sum(nums, target):
    for i in range(len(nums)):
        for j in range(i + 1, len(nums)):
            if nums[i] + nums[j] == target:
                return [i, j]
"""),
    func("transpose", "def transpose(matrix):",
       "Return the transpose of matrix, a rectangular list of equal-length rows (row i of the result is column i).",
       [([[[1, 2, 3], [4, 5, 6]]], [[1, 4], [2, 5], [3, 6]]), ([[[1]]], [[1]])],
       [([[[1, 2]]], [[1], [2]]), ([[[1], [2], [3]]], [[1, 2, 3]]), ([[[1, 2], [3, 4]]], [[1, 3], [2, 4]]),
        ([[[0, 0, 1], [1, 0, 0], [2, 2, 2]]], [[0, 1, 2], [0, 0, 2], [1, 0, 2]])], """
def transpose(matrix):
    return [[row[c] for row in matrix] for c in range(len(matrix[0]))]
"""),
    func("diagonal_sum", "def diagonal_sum(matrix):",
       "Return the sum of the main-diagonal elements matrix[i][i] of the square matrix.",
       [([[[1, 2], [3, 4]]], 5), ([[[7]]], 7)],
       [([[[1, 2, 3], [4, 5, 6], [7, 8, 9]]], 15), ([[[0, 1], [1, 0]]], 0), ([[[-1, 5], [5, -1]]], -2),
        ([[[2, 0, 0, 0], [0, 2, 0, 0], [0, 0, 2, 0], [0, 0, 0, 2]]], 8)], """
def diagonal_sum(matrix):
    return sum(matrix[i][i] for i in range(len(matrix)))
"""),
    func("count_pairs_with_sum", "def count_pairs_with_sum(nums, target):",
       "Return the number of index pairs i < j with nums[i] + nums[j] == target.",
       [([[1, 2, 3, 4], 5], 2), ([[1, 1, 1], 2], 3)],
       [([[], 0], 0), ([[5], 10], 0), ([[0, 0, 0, 0], 0], 6), ([[1, 5, 7, -1, 5], 6], 3)], """
def count_pairs_with_sum(nums, target):
    n = len(nums)
    return sum(1 for i in range(n) for j in range(i + 1, n) if nums[i] + nums[j] == target)
"""),
    func("max_subarray_sum", "def max_subarray_sum(nums):",
       "Return the largest possible sum of a non-empty run of consecutive elements of nums.",
       [([[-2, 1, -3, 4, -1, 2, 1, -5, 4]], 6), ([[1]], 1)],
       [([[-3, -1, -2]], -1), ([[5, 4, -1, 7, 8]], 23), ([[2, -1, 2]], 3), ([[-1, 0, -2]], 0)], """
def max_subarray_sum(nums):
    best = current = nums[0]
    for x in nums[1:]:
        current = max(x, current + x)
        best = max(best, current)
    return best
"""),
    func("balanced_brackets", "def balanced_brackets(s):",
       "s holds only the characters ()[]{}. Return True if its brackets are balanced and properly nested, "
       "else False.",
       [(["([]{})"], True), (["(]"], False)],
       [([""], True), (["(("], False), (["{[()()]}"], True), (["([)]"], False), (["())("], False)], """
def balanced_brackets(s):
    pairs, stack = {")": "(", "]": "[", "}": "{"}, []
    for ch in s:
        if ch in pairs:
            if not stack or stack.pop() != pairs[ch]:
                return False
        else:
            stack.append(ch)
    return not stack
"""),
    func("missing_number", "def missing_number(nums):",
       "nums holds, in any order, every integer from 0 to n except one, where n = len(nums). Return the missing "
       "integer.",
       [([[3, 0, 1]], 2), ([[0]], 1)],
       [([[1]], 0), ([[0, 1, 2, 4]], 3), ([[9, 6, 4, 2, 3, 5, 7, 0, 1]], 8), ([[1, 2, 3]], 0)], """
def missing_number(nums):
    n = len(nums)
    return n * (n + 1) // 2 - sum(nums)
"""),
    func("collatz_steps", "def collatz_steps(n):",
       "Starting from an integer n >= 1, repeatedly replace n by n / 2 when it is even and by 3 * n + 1 when it "
       "is odd. Return how many replacements it takes to reach 1.",
       [([6], 8), ([1], 0)],
       [([2], 1), ([3], 7), ([7], 16), ([27], 111)], """
def collatz_steps(n):
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps
"""),
    func("remove_vowels", "def remove_vowels(s):", "Return s without its vowels (a, e, i, o, u, in either case).",
       [(["hello world"], "hll wrld"), (["AEIOU"], "")],
       [([""], ""), (["rhythm"], "rhythm"), (["Programming"], "Prgrmmng"), (["a1e2"], "12")], """
def remove_vowels(s):
    return "".join(ch for ch in s if ch.lower() not in "aeiou")
"""),
    func("sum_of_squares", "def sum_of_squares(n):",
         "Return 1*1 + 2*2 + ... + n*n for an integer n >= 0 (0 when n is 0).",
       [([3], 14), ([0], 0)],
       [([1], 1), ([10], 385), ([5], 55), ([100], 338350)], """
def sum_of_squares(n):
    return sum(i * i for i in range(1, n + 1))
"""),
    func("digital_root", "def digital_root(n):",
       "Repeatedly replace the integer n >= 0 by the sum of its decimal digits until a single digit is left, and "
       "return that digit.",
       [([38], 2), ([0], 0)],
       [([9], 9), ([123456], 3), ([99], 9), ([1000000], 1)], """
def digital_root(n):
    while n >= 10:
        n = sum(int(d) for d in str(n))
    return n
"""),
    func("word_lengths", "def word_lengths(s):",
       "Return the list of the lengths of the words of s, in order (words are separated by one or more spaces).",
       [(["hi there"], [2, 5]), (["a bb ccc"], [1, 2, 3])],
       [([""], []), (["word"], [4]), (["  spaced   out "], [6, 3]), (["one two three four"], [3, 3, 5, 4])], """
def word_lengths(s):
    return [len(w) for w in s.split()]
"""),
    func("interleave", "def interleave(a, b):",
       "Return a list that alternates the elements of the lists a and b (a[0], b[0], a[1], b[1], ...); the "
       "leftover elements of the longer list go at the end.",
       [([[1, 2, 3], ["a", "b", "c"]], [1, "a", 2, "b", 3, "c"]), ([[1], [2, 3, 4]], [1, 2, 3, 4])],
       [([[], []], []), ([[1, 2, 3], []], [1, 2, 3]), ([[0, 0], [1]], [0, 1, 0]),
        ([["x"], ["y", "z"]], ["x", "y", "z"])],
       """
def interleave(a, b):
    out = []
    for i in range(max(len(a), len(b))):
        if i < len(a):
            out.append(a[i])
        if i < len(b):
            out.append(b[i])
    return out
"""),
    func("is_leap_year", "def is_leap_year(year):",
       "Return True if year is a leap year of the Gregorian calendar (divisible by 4, except the years divisible "
       "by 100 but not by 400), else False.",
       [([2024], True), ([1900], False)],
       [([2000], True), ([2023], False), ([2100], False), ([1600], True)], """
def is_leap_year(year):
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
"""),
    # ---------------------------------------------------------------------------------------- stdin problems
    stdio("sum_list", "The first line holds an integer n, the second line n integers separated by spaces. "
       "Print their sum.",
       [("3\n1 2 3\n", "6"), ("1\n-5\n", "-5")],
       [("5\n10 20 30 40 50\n", "150"), ("4\n-1 1 -1 1\n", "0"), ("2\n1000000 2000000\n", "3000000"),
        ("0\n\n", "0")], """
import sys
data = sys.stdin.read().split()
n = int(data[0])
print(sum(int(x) for x in data[1:1 + n]))
"""),
    stdio("shout", "Read one line of text and print it in upper case.",
       [("hello\n", "HELLO"), ("Python 3\n", "PYTHON 3")],
       [("a\n", "A"), ("Mixed Case Words\n", "MIXED CASE WORDS"), ("123 abc!\n", "123 ABC!"),
        ("already UP\n", "ALREADY UP")], """
print(input().upper())
"""),
    stdio("min_max", "Read one line of integers separated by spaces and print the smallest and the largest of them, "
       "separated by a space.",
       [("3 1 4 1 5\n", "1 5"), ("7\n", "7 7")],
       [("-2 -8 0\n", "-8 0"), ("10 20\n", "10 20"), ("5 5 5 5\n", "5 5"), ("100 -100 50\n", "-100 100")], """
nums = [int(x) for x in input().split()]
print(min(nums), max(nums))
"""),
    stdio("fizzbuzz", "Read an integer n and print the numbers from 1 to n, one per line, but print Fizz instead of "
       "the multiples of 3, Buzz instead of the multiples of 5 and FizzBuzz instead of the multiples of both.",
       [("5\n", "1\n2\nFizz\n4\nBuzz"), ("1\n", "1")],
       [("3\n", "1\n2\nFizz"), ("15\n", "1\n2\nFizz\n4\nBuzz\nFizz\n7\n8\nFizz\nBuzz\n11\nFizz\n13\n14\nFizzBuzz"),
        ("0\n", ""), ("10\n", "1\n2\nFizz\n4\nBuzz\nFizz\n7\n8\nFizz\nBuzz")], """
n = int(input())
for i in range(1, n + 1):
    if i % 15 == 0:
        print("FizzBuzz")
    elif i % 3 == 0:
        print("Fizz")
    elif i % 5 == 0:
        print("Buzz")
    else:
        print(i)
"""),
    stdio("staircase", "Read an integer n and print n lines: line i (counting from 1) holds i '*' characters.",
       [("3\n", "*\n**\n***"), ("1\n", "*")],
       [("0\n", ""), ("2\n", "*\n**"), ("5\n", "*\n**\n***\n****\n*****"), ("4\n", "*\n**\n***\n****")], """
n = int(input())
for i in range(1, n + 1):
    print("*" * i)
"""),
    stdio("reverse_lines", "The first line holds an integer n, and n lines of text follow. Print those n lines in "
       "reverse order.",
       [("3\na\nb\nc\n", "c\nb\na"), ("1\nonly\n", "only")],
       [("2\nhello world\nbye\n", "bye\nhello world"), ("4\n1\n2\n3\n4\n", "4\n3\n2\n1"), ("0\n", ""),
        ("3\nx y\nz\nw v u\n", "w v u\nz\nx y")], """
n = int(input())
lines = [input() for _ in range(n)]
for line in reversed(lines):
    print(line)
"""),
    stdio("average", "Read one line of integers and print their average with exactly two digits after the decimal "
       "point.",
       [("1 2 3 4\n", "2.50"), ("5\n", "5.00")],
       [("1 2\n", "1.50"), ("-1 -2 -3\n", "-2.00"), ("10 20 30\n", "20.00"), ("1 1 2\n", "1.33")], """
nums = [int(x) for x in input().split()]
print(f"{sum(nums) / len(nums):.2f}")
"""),
    stdio("even_odd", "The first line holds an integer n, the second line n integers. Print how many of them are even "
       "and how many are odd, separated by a space.",
       [("4\n1 2 3 4\n", "2 2"), ("3\n2 4 6\n", "3 0")],
       [("1\n7\n", "0 1"), ("5\n0 -1 -2 5 9\n", "2 3"), ("6\n11 13 15 17 19 21\n", "0 6"), ("2\n100 101\n", "1 1")],
       """
input()
nums = [int(x) for x in input().split()]
even = sum(1 for x in nums if x % 2 == 0)
print(even, len(nums) - even)
"""),
    stdio("count_words_line", "Read one line and print the number of words in it (words are separated by one or more "
       "spaces).",
       [("the cat sat\n", "3"), ("hello\n", "1")],
       [("\n", "0"), ("  many   spaces here  \n", "3"), ("a b c d e f g\n", "7"), ("one  two\n", "2")], """
print(len(input().split()))
"""),
    stdio("sort_numbers", "Read one line of integers and print them in increasing order, separated by spaces.",
       [("3 1 2\n", "1 2 3"), ("5\n", "5")],
       [("9 -1 0 4\n", "-1 0 4 9"), ("2 2 1 1\n", "1 1 2 2"), ("10 9 8 7 6\n", "6 7 8 9 10"), ("-5 -10\n", "-10 -5")],
       """
nums = sorted(int(x) for x in input().split())
print(" ".join(str(x) for x in nums))
"""),
    stdio("a_plus_b", "The first line holds an integer t; each of the next t lines holds two integers a and b. For "
       "every such line print a + b on its own line.",
       [("2\n1 2\n3 4\n", "3\n7"), ("1\n-5 5\n", "0")],
       [("3\n0 0\n10 -3\n100 200\n", "0\n7\n300"), ("1\n123456789 987654321\n", "1111111110"),
        ("4\n1 1\n2 2\n3 3\n4 4\n", "2\n4\n6\n8"), ("2\n-1 -1\n7 0\n", "-2\n7")], """
t = int(input())
for _ in range(t):
    a, b = map(int, input().split())
    print(a + b)
"""),
    stdio("times_table", "Read an integer n and print n*1, n*2, ..., n*10 on one line, separated by spaces.",
       [("2\n", "2 4 6 8 10 12 14 16 18 20"), ("1\n", "1 2 3 4 5 6 7 8 9 10")],
       [("0\n", "0 0 0 0 0 0 0 0 0 0"), ("7\n", "7 14 21 28 35 42 49 56 63 70"),
        ("-3\n", "-3 -6 -9 -12 -15 -18 -21 -24 -27 -30"), ("11\n", "11 22 33 44 55 66 77 88 99 110")], """
n = int(input())
print(*[n * i for i in range(1, 11)])
"""),
    stdio("letter_counts", "Read a word of lowercase letters. For every distinct letter, in alphabetical order, print "
       "the letter and how often it occurs, separated by a space, one letter per line.",
       [("banana\n", "a 3\nb 1\nn 2"), ("z\n", "z 1")],
       [("abcabc\n", "a 2\nb 2\nc 2"), ("hello\n", "e 1\nh 1\nl 2\no 1"), ("zzzy\n", "y 1\nz 3"),
        ("mississippi\n", "i 4\nm 1\np 2\ns 4")], """
word = input().strip()
for ch in sorted(set(word)):
    print(ch, word.count(ch))
"""),
    stdio("palindrome_lines", "The first line holds an integer t; each of the next t lines holds one word. For every "
       "word print YES if it reads the same backwards, otherwise NO.",
       [("2\nlevel\nhello\n", "YES\nNO"), ("1\na\n", "YES")],
       [("3\nabba\nabc\nracecar\n", "YES\nNO\nYES"), ("2\nab\naa\n", "NO\nYES"), ("1\nnoon\n", "YES"),
        ("2\nabca\nxyzyx\n", "NO\nYES")], """
t = int(input())
for _ in range(t):
    w = input().strip()
    print("YES" if w == w[::-1] else "NO")
"""),
    stdio("spread", "Read one line of integers and print the largest minus the smallest.",
       [("1 5 3\n", "4"), ("7\n", "0")],
       [("-5 5\n", "10"), ("2 2 2\n", "0"), ("100 1 50\n", "99"), ("-3 -9 -4\n", "6")], """
nums = list(map(int, input().split()))
print(max(nums) - min(nums))
"""),
    stdio("letters_digits", "Read one line and print how many letters and how many digits it contains, separated by a "
       "space.",
       [("abc123\n", "3 3"), ("hello world!\n", "10 0")],
       [("\n", "0 0"), ("2024 is a year\n", "7 4"), ("a1b2c3d4\n", "4 4"), ("!!!\n", "0 0")], """
line = input()
print(sum(ch.isalpha() for ch in line), sum(ch.isdigit() for ch in line))
"""),
    stdio("fahrenheit", "Read one line of Celsius temperatures (integers, all multiples of 5) and print each of "
          "them in Fahrenheit, F = C * 9 / 5 + 32, as an integer, separated by spaces.",
       [("0 100\n", "32 212"), ("-40\n", "-40")],
       [("5\n", "41"), ("20 25 30\n", "68 77 86"), ("-10 -5\n", "14 23"), ("35\n", "95")], """
print(" ".join(str(int(c) * 9 // 5 + 32) for c in input().split()))
"""),
    stdio("triangle_number", "Read an integer n >= 0 and print 1 + 2 + ... + n.",
       [("4\n", "10"), ("0\n", "0")],
       [("1\n", "1"), ("100\n", "5050"), ("10\n", "55"), ("1000\n", "500500")], """
n = int(input())
print(n * (n + 1) // 2)
"""),
    stdio("contains", "Read two lines, a text and then a pattern. Print YES if the pattern occurs in the text (case "
       "matters), otherwise NO.",
       [("hello world\nlo w\n", "YES"), ("abc\nd\n", "NO")],
       [("aaaa\naa\n", "YES"), ("abc\nabcd\n", "NO"), ("Case\ncase\n", "NO"), ("banana\nnan\n", "YES")], """
text = input()
pattern = input()
print("YES" if pattern in text else "NO")
"""),
    stdio("row_maxima", "The first line holds an integer r; each of the next r lines holds integers separated by "
       "spaces. Print the largest integer of every line, one per line.",
       [("2\n1 5 3\n4 2\n", "5\n4"), ("1\n-7\n", "-7")],
       [("3\n1\n2 2\n0 9 -1\n", "1\n2\n9"), ("2\n-1 -2\n-3 -4\n", "-1\n-3"), ("1\n10 20 30 40\n", "40"),
        ("2\n8 8\n7 9\n", "8\n9")], """
r = int(input())
for _ in range(r):
    print(max(int(x) for x in input().split()))
"""),
]
