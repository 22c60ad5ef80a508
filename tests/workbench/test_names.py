"""``workbench.names``: the CLI's choices, torch-free, and the same as the names the code that
cannot import it (models/, and modules that key settings by name) defines."""

import subprocess
import sys


def test_names_import_no_torch():
    script = "import sys, workbench.names; assert 'torch' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", script], check=True)


def test_the_models_names_are_the_same():
    from models.full_bandwidth import FullBandwidthLM
    from models.presets import PRESETS
    from workbench import names

    assert names.PRESETS == tuple(PRESETS)
    assert names.REGIMES == FullBandwidthLM.regimes


def test_the_names_of_settings_tables_are_the_same():
    from workbench import names
    from workbench.experiments import fbt_vs_baseline
    from workbench.probing.sae import ARCHITECTURES
    from workbench.runtime.config import ARCHS
    from workbench.training import zoo

    assert names.ARCHS == tuple(ARCHS)
    assert names.SAE_ARCHITECTURES == ARCHITECTURES
    assert names.ZOO_SCALES == tuple(zoo.SCALES)
    assert names.FAIR_SCALES == tuple(fbt_vs_baseline.SCALES)


def test_the_comparison_studies_are_the_registrys():
    """The CLI's study names are the plugin registry's, in its order; every study, the fair one too,
    has a readings table for the app."""
    from workbench import names
    from workbench.experiments.studies import ROWS, STUDIES

    assert names.COMPARISON_STUDIES == tuple(STUDIES)
    assert names.STUDIES == tuple(ROWS)
