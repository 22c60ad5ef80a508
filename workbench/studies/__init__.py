"""Studies on trained models: trace lengths per regime, HD stream similarity, the playground."""
