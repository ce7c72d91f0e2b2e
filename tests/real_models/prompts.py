"""The real-model suite's models and prompts, shared by its scripts."""

# key, GGUF file name, whether Kiln runs it yet (informational; the Rust
# test keeps its own list).
MODELS = [
    ("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    ("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q5_0.gguf"),
    ("gemma3-270m", "gemma-3-270m-q4_k_m.gguf"),
]


CHAT_QUESTION = "What is the capital of France, and why is it famous?"

PARAGRAPH = (
    "The old lighthouse stood at the edge of the cliff, its white paint peeling after decades of salt "
    "and wind. Every evening the keeper climbed the spiral stairs to light the lamp, even though ships "
    "now relied on satellites to find their way. He said the light was not for the ships anymore, but "
    "for the town, which had grown used to its slow and steady turning."
)

CODE = '''def merge_sorted(a, b):
    """Merge two sorted lists into one sorted list."""
    result = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            result.append(a[i])
            i += 1
        else:
            result.append(b[j])
            j += 1
    result.extend(a[i:])
    result.extend(b[j:])
    return result
'''

LONG_TEXT = (
    "Bread is one of the oldest prepared foods. Archaeologists have found charred crumbs at a site in "
    "northeastern Jordan that are more than fourteen thousand years old, which means people were baking "
    "flatbreads from wild cereals thousands of years before farming began. The discovery suggests that the "
    "effort of making bread may even have encouraged people to cultivate grain in the first place.\n\n"
    "Early breads were dense and flat. Leavened bread, which rises because yeast or bacteria produce gas "
    "inside the dough, appeared later, and the ancient Egyptians are usually credited with making it "
    "common. They kept a portion of each batch of fermented dough to start the next one, a practice that "
    "survives today in the sourdough starters that bakers feed with flour and water every day.\n\n"
    "In the Roman Empire, baking became a trade. Large cities had public bakeries with stone mills turned "
    "by donkeys, and the state distributed free or cheap grain to citizens to keep the peace. Bread was "
    "graded by colour: white bread, made from finely sifted flour, was eaten by the wealthy, while darker "
    "loaves containing more bran were left for the poor.\n\n"
    "The industrial revolution changed bread again. Steel roller mills, introduced in the nineteenth "
    "century, separated the bran and germ from the flour far more efficiently than stones, and white "
    "bread became cheap enough for everyone. In 1961 British scientists developed the Chorleywood process, "
    "which uses intense mechanical mixing to shorten fermentation, and most supermarket loaves are still "
    "made this way. At the same time, a revival of small bakeries has brought slow fermentation, whole "
    "grains and traditional methods back into fashion in many countries."
)

# name, text, chat
PROMPTS = [
    ("chat", CHAT_QUESTION, True),
    ("paragraph", PARAGRAPH, False),
    ("code", CODE, False),
    ("long", LONG_TEXT, False),
]
