"""Entry script: ``streamlit run app/main.py`` (what ``workbench app`` starts)."""

import streamlit as st

from app.state import device_picker, runs_root_picker, threads_picker

st.set_page_config(page_title="Latent workbench", page_icon=":material/science:", layout="wide")
page = st.navigation(
    [
        st.Page("views/runs.py", title="Runs", icon=":material/folder_open:", default=True),
        st.Page("views/zoo.py", title="Zoo and studies", icon=":material/pets:"),
        st.Page("views/probes.py", title="Probes", icon=":material/query_stats:"),
        st.Page("views/sae.py", title="Sparse autoencoders", icon=":material/scatter_plot:"),
        st.Page("views/dynamics.py", title="Feedback dynamics", icon=":material/all_inclusive:"),
        st.Page("views/traces.py", title="Trace lengths", icon=":material/straighten:"),
        st.Page("views/streams.py", title="Streams (HD)", icon=":material/view_stream:"),
        st.Page("views/playground.py", title="Playground", icon=":material/keyboard:"),
    ]
)
runs_root_picker()
device_picker()
threads_picker()
page.run()
