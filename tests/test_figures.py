"""Architecture figures (msgcore.figures) come from the built model's modules."""
import matplotlib
import pytest

from msgcore.figures import architecture, stacks
from msgcore.model import Transformer, preset

matplotlib.use("Agg")


def test_a_transformers_stacks_are_read_from_its_modules():
    model = Transformer(preset("small", vocab_size=8000, pad_id=0))
    encoder, decoder = stacks(model)
    assert (encoder.name, decoder.name) == ("encoder", "decoder")
    (text, count), = encoder.layers  # three identical layers are drawn once, "x 3"
    assert count == 3 and "MultiHeadAttention (4 heads × 64)" in text and "FeedForward 256→1024→256" in text
    assert "cross_attn" in decoder.layers[0][0] and "cross_attn" not in text
    assert decoder.above == ["final_norm: LayerNorm", "output_projection: Linear 256→8000"]
    assert encoder.below == ["embed: Embeddings (Embedding 8000×256)"]


def test_a_layer_of_another_structure_gets_its_own_box():
    model = Transformer(preset("tiny", vocab_size=100, pad_id=0))
    del model.encoder.layers[1].ffn  # the second layer now differs from the first
    assert [count for _, count in stacks(model)[0].layers] == [1, 1]


def test_arrows_only_between_stacks_that_exist():
    model = Transformer(preset("tiny", vocab_size=100, pad_id=0))
    assert architecture(model, flows={"decoder": ["encoder"]}).axes
    with pytest.raises(ValueError, match="the stacks are encoder, decoder"):
        architecture(model, flows={"decoder": ["fine_encoder"]})
    with pytest.raises(ValueError, match="no layer stack"):
        architecture(model.encoder.layers[0])


def test_every_papers_model_has_its_stacks_found_and_postechs_joint_encoder_has_two():
    from msgcore.models.marge import MargeConfig, MargeTransformer
    from msgcore.models.mixrep import MixRepConfig, MixRepTransformer
    from msgcore.models.postech_ape import PostechAPE, PostechConfig
    from msgcore.models.trice import TriceConfig, TriceTransformer

    dims = dict(vocab_size=60, d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, pad_id=0)
    names = {cls.__name__: [s.name for s in stacks(cls(config(**dims)))]
             for cls, config in ((PostechAPE, PostechConfig), (TriceTransformer, TriceConfig),
                                 (MixRepTransformer, MixRepConfig), (MargeTransformer, MargeConfig))}
    assert names["PostechAPE"][:2] == ["encoder.src_layers", "encoder.mt_layers"] and "decoder" in names["PostechAPE"]
    assert names["TriceTransformer"] == ["encoder", "decoder", "fine_encoder"]
    assert all(len(found) >= 2 for found in names.values()), names
    postech = stacks(PostechAPE(PostechConfig(**dims)))
    assert "src_attn" in postech[1].layers[0][0] and "src_attn" not in postech[0].layers[0][0]
    # each stack of the joint encoder keeps its own final norm; the embeddings they share sit under both
    assert [[text.split(":")[0] for text in stack.above] for stack in postech[:2]] == [["src_final_norm"],
                                                                                       ["mt_final_norm"]]
    assert postech[0].below == postech[1].below != []
    mixrep = stacks(MixRepTransformer(MixRepConfig(**dims)))[0]  # the two streams' embeddings, one line each
    assert mixrep.below[0].startswith("embed: bpe: Embeddings") and mixrep.below[0].split("\n")[1].startswith(
        "sp: Embeddings")
    # a layer's per-stream LayerNorms are residual plumbing like a plain LayerNorm: no line of their own
    layer_text = mixrep.layers[0][0]
    assert "norm" not in layer_text.lower() and "self_attn: bpe:" in layer_text


def test_an_arrow_past_a_stack_in_between_passes_over_every_stack_name():
    """POSTECH's decoder reads the src encoder across the mt encoder's column: that arrow rises from above the src
    stack's name, crosses above every name, and comes down onto the decoder's; the neighbours' arrow stays below."""
    from matplotlib.path import Path

    from msgcore import figures
    from msgcore.models.postech_ape import PostechAPE, PostechConfig

    dims = dict(vocab_size=60, d_model=32, n_heads=4, d_ff=64, encoder_layers=2, decoder_layers=2, pad_id=0)
    fig = architecture(PostechAPE(PostechConfig(**dims)), flows={"decoder": ["encoder.src_layers", "encoder.mt_layers"]})
    ax = fig.axes[0]
    names = {t.get_text(): t.get_position()[1] for t in ax.texts if t.get_text() in ("encoder.src_layers",
                                                                                     "encoder.mt_layers", "decoder")}
    past, neighbours = ([(x, y) for (x, y, *_), code in p.get_path().iter_segments(simplify=False)
                         if code != Path.CLOSEPOLY] for p in ax.patches)
    assert min(y for _, y in past) >= names["encoder.src_layers"] + figures.NAME  # never down through a name or box
    assert max(y for _, y in past) > max(names.values()) + figures.NAME  # over every name
    assert ax.get_ylim()[1] > max(y for _, y in past)  # inside the figure, not clipped
    assert max(y for _, y in neighbours) < names["decoder"]  # between neighbours: into the stack, under its name


def test_columns_follow_a_given_order_that_names_every_stack_once():
    """TRICE declares its fine encoder after the decoder; its figure reads encoder, fine encoder, decoder."""
    from msgcore.models.trice import TriceConfig, TriceTransformer

    model = TriceTransformer(TriceConfig(vocab_size=60, d_model=32, n_heads=4, d_ff=64, encoder_layers=2,
                                         decoder_layers=2, pad_id=0))
    fig = architecture(model, order=["encoder", "fine_encoder", "decoder"])
    names = sorted((t.get_position()[0], t.get_text()) for t in fig.axes[0].texts
                   if t.get_text() in ("encoder", "fine_encoder", "decoder"))
    assert [name for _, name in names] == ["encoder", "fine_encoder", "decoder"]
    for order in (["encoder", "decoder"], ["encoder", "decoder", "decoder", "fine_encoder"],
                  ["encoder", "decoder", "fine_coder"]):
        with pytest.raises(ValueError, match="order must name each stack once; the stacks are encoder, decoder"):
            architecture(model, order=order)
